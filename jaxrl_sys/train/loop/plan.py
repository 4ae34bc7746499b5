"""The run's arithmetic, computed once: `RunPlan`.

Every rule that turns settings into numbers the loop, the evaluators, the rollout engines and
the multi-process step share has its one home here: samples per group (MC-GRPO draws G + 1),
the packed row length and its granule, the length check, the in-flight budget and the engines
sized for it, the resolved precision and the two model configs it gives, the version gate of
each mode, and the process layout. `RunPlan.derive` is called once (by `recipe.build_recipe`)
and the frozen plan is handed to `RLLoop`, `evaluate`, `PeriodicEval` and `ProcessGroup`, which
re-derive and re-validate nothing.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxrl_sys.models import ModelConfig, SamplingConfig
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.sharding import MeshSpec
from jaxrl_sys.train.loop.config import LoopConfig, check_lengths, extra_groups
from jaxrl_sys.train.precision import PrecisionConfig
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import TrainConfig

# Completions per held-out problem of an evaluation (the same prompts and keys every call).
EVAL_SAMPLES = 4
# The rollout engines' decode slots at most (in-flight requests beyond them queue).
MAX_SLOTS = 512


def engine_config(loop: LoopConfig, samples_per_group: int, eos_id: int) -> EngineConfig:
  """An `EngineConfig` sized for the loop's in-flight requests (`inflight_groups` groups of
  `samples_per_group`). In-flight requests continue across a weight swap with their KV
  recomputed under the new weights (`recompute_kv_on_swap`), what aborting and resubmitting
  them would do, without leaving their worker."""
  return EngineConfig(
      num_slots=min(inflight_groups(loop) * samples_per_group, MAX_SLOTS), max_len=loop.seq_len,
      stream_every=min(8, loop.max_new_tokens),
      sampling=SamplingConfig(temperature=loop.temperature, stop_tokens=(eos_id,)),
      recompute_kv_on_swap=True)


def inflight_groups(loop: LoopConfig) -> int:
  """Groups in flight at most: the admission budget `(eta + 1) * B` plus APRIL's extra ones."""
  return (loop.staleness + 1) * loop.prompts_per_step + extra_groups(loop)


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """What a run computes with, derived once from its settings (`RunPlan.derive`).

  Attributes:
    train: the jitted step's config.
    loop: the host loop's settings (lengths filled in).
    precision: the dtype policy, resolved (no "auto").
    train_model: the policy as trained (`precision.train_model`).
    rollout_model: the policy as the engines run it (`precision.rollout_model`).
    samples_per_group: S, completions per prompt (G, or G + 1 with MC-GRPO's median pivot).
    row_granule: the step between packed row lengths (`batch.row_granule`).
    inflight_groups: groups in flight at most (admission budget plus over-provisioning).
    engine: the training rollout's engines (slots for every in-flight sample); its
      `sampling` is the run's one sampling section: the engines sample at its temperature and
      the step computes its log-probs at it.
    eval_samples: completions per held-out problem of an evaluation.
    eval_engine: the evaluation rollout's engines (`eval_samples` per group).
    mesh: the training mesh's shape.
    processes: JAX processes of the run (each builds its rows of every batch when > 1).
  """
  train: TrainConfig
  loop: LoopConfig
  precision: PrecisionConfig
  train_model: ModelConfig
  rollout_model: ModelConfig
  samples_per_group: int
  row_granule: int
  inflight_groups: int
  engine: EngineConfig
  eval_samples: int
  eval_engine: EngineConfig
  mesh: MeshSpec | None = None
  processes: int = 1

  @classmethod
  def derive(cls, model: ModelConfig, train: TrainConfig, loop: LoopConfig,
             precision: PrecisionConfig, eos_id: int, *, mesh: MeshSpec | None = None,
             processes: int = 1, eval_samples: int = EVAL_SAMPLES) -> RunPlan:
    """The plan of a run (no JAX computation).

    Args:
      model: the policy's config as loaded (its dtypes are replaced by `precision`'s).
      train, loop: the step's and the loop's configs (`loop` with its lengths filled in).
      precision: the dtype policy, resolved (`PrecisionConfig.resolve`: no "auto").
      eos_id: the tokenizer's end-of-sequence id (the engines' stop token).
      mesh: the training mesh's shape; processes: the run's JAX processes.
      eval_samples: completions per held-out problem of an evaluation.

    Raises:
      ValueError: the prompt bucket plus the response budget exceed the model's context;
        `precision` has "auto" dtypes; a layout of several processes with settings it cannot
        split (`check_processes`).
    """
    check_lengths(model.max_seq_len, loop)
    samples = loop.group_size + int(train.advantage.baseline == "median")
    plan = cls(train=train, loop=loop, precision=precision,
               train_model=precision.train_model(model),
               rollout_model=precision.rollout_model(precision.train_model(model)),
               samples_per_group=samples, row_granule=batch_lib.row_granule(loop.max_prompt_len),
               inflight_groups=inflight_groups(loop), engine=engine_config(loop, samples, eos_id),
               eval_samples=eval_samples, eval_engine=engine_config(loop, eval_samples, eos_id),
               mesh=mesh, processes=processes)
    plan.check_processes()
    return plan

  @property
  def seq_len(self) -> int:
    """Longest packed row: the prompt bucket plus the response budget."""
    return self.loop.seq_len

  def admitted_by(self, version: int) -> int:
    """Groups admitted in all once weight version `version` is current (AReaL's rule, plus
    APRIL's over-provisioning): `(eta + version + 1) * B + extra`."""
    return self.inflight_groups + version * self.loop.prompts_per_step

  def min_version(self, version: int) -> int:
    """The oldest weight version allowed to serve a request admitted at `version`: sync
    (strict on-policy) and async (a request's staleness counts from its admission) must not
    be served by older weights; one_off accepts any (-1)."""
    return version if self.loop.mode in ("sync", "async") else -1

  @property
  def route_shape(self):
    """`(layers, k, dtype)` of the rollout routes packed beside the tokens (an MoE policy under
    routing replay R3, `TrainConfig.routing_replay`), or None."""
    m = self.train_model.moe
    if m is None or self.train.routing_replay != "R3":
      return None
    from jaxrl_sys.models.moe import route_dtype  # pylint: disable=import-outside-toplevel
    return (self.train_model.num_layers, m.num_experts_per_tok,
            np.dtype(route_dtype(m.num_experts)))

  def row_length(self, samples: Sequence[batch_lib.Sample]) -> int:
    """Packed row length of a micro-batch: what its rows need, in `row_granule` steps, with
    the response budget as the scoring window."""
    return batch_lib.row_length(samples, self.seq_len, self.row_granule,
                                window=self.loop.max_new_tokens)

  def check_processes(self) -> None:
    """Raises ValueError for settings a run over several processes cannot split: each
    step's groups must be fixed in advance (sync mode, no over-provisioning) so that every
    process knows its rows."""
    if self.processes > 1 and (self.loop.mode != "sync" or extra_groups(self.loop)):
      raise ValueError(
          f"a mesh spanning {self.processes} processes trains with loop.mode=sync and "
          f"loop.oversample=1 (got loop.mode={self.loop.mode}, "
          f"loop.oversample={self.loop.oversample:g}): each step's groups must be fixed in "
          "advance so every process knows its rows")

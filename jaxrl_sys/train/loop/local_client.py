"""The embedded rollout client: a `RolloutManager` over in-process engines on the trainer's
devices, sized for the loop's in-flight requests (`default_client`, `default_engine_config`,
`local_worker_count`), and the loop's length check."""
from __future__ import annotations

import dataclasses
import math
import threading


from jaxrl_sys import backend
from jaxrl_sys.models import ModelConfig, SamplingConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.manager import RolloutManager
from jaxrl_sys.rollout.manager.config import ManagerConfig
from jaxrl_sys.rollout.workers.thread import ThreadWorker
from jaxrl_sys.rollout.types import RolloutClient
from jaxrl_sys.rollout.workers.server import InProcessWorker
from jaxrl_sys.train.loop.config import LoopConfig

# Auto mode splits the in-process rollout over two engines only when each keeps this many slots.
MIN_SLOTS_PER_LOCAL_WORKER = backend.MIN_SLOTS_PER_LOCAL_ENGINE


def check_lengths(model_config: ModelConfig, loop: LoopConfig) -> None:
  """Raises ValueError when the prompt bucket plus the response budget exceed the context."""
  if loop.seq_len > model_config.max_seq_len:
    raise ValueError(
        f"prompt longer than the context: max_prompt_len {loop.max_prompt_len} + max_new_tokens "
        f"{loop.max_new_tokens} = {loop.seq_len} > the model's max_seq_len "
        f"{model_config.max_seq_len}")


def default_engine_config(loop: LoopConfig, samples_per_group: int, eos_id: int):
  """An `EngineConfig` sized for the loop's in-flight requests. In-flight requests continue
  across a weight swap with their KV recomputed under the new weights (`recompute_kv_on_swap`),
  what aborting and resubmitting them would do, without leaving their worker."""
  groups = (loop.staleness + 1) * loop.prompts_per_step + extra_groups(loop)
  return EngineConfig(
      num_slots=min(groups * samples_per_group, 512), max_len=loop.seq_len,
      stream_every=min(8, loop.max_new_tokens),
      sampling=SamplingConfig(temperature=loop.temperature, stop_tokens=(eos_id,)),
      recompute_kv_on_swap=True)


def local_worker_count(loop: LoopConfig, num_slots: int) -> int:
  """Engines of the embedded rollout: `loop.local_workers`, or (0 = auto) two on a CPU host
  with at least two cores when each keeps at least `MIN_SLOTS_PER_LOCAL_WORKER` slots (one
  engine's small decode ops leave a core idle a third of the time there; see
  `rollout.workers.thread`), else one (an accelerator runs one engine's batch best)."""
  return backend.local_engine_count(loop.local_workers, num_slots)


def default_client(model_config: ModelConfig, params, loop: LoopConfig, eos_id: int, version: int,
                   samples_per_group: int, engine_config=None, moe_state=None, *,
                   warmup: bool = False, clock: Clock = WALL, base=None) -> RolloutClient:
  """The embedded default: a `RolloutManager` over the in-process workers on this process's
  devices (`local_worker_count`: one `InProcessWorker`, or `ThreadWorker`s sharing the engine
  config's slots), with the in-memory (zero-copy) weight store, serving `params` as `version`
  (with LoRA: the adapters, on `base`, a `rollout.weights.BaseWeights`).
  """
  ec = engine_config or default_engine_config(loop, samples_per_group, eos_id)
  n = local_worker_count(loop, ec.num_slots)
  if n == 1:
    manager = RolloutManager([InProcessWorker("local-0", model_config, ec, warmup=warmup)],
                             clock=clock)
  else:
    # The slots split evenly; the rows/lengths buckets follow each engine's own slots.
    part = dataclasses.replace(ec, num_slots=-(-ec.num_slots // n), decode_row_buckets=())
    first_load = threading.Lock()
    workers = [ThreadWorker(f"local-{i}", model_config, part, warmup=warmup, first_load=first_load)
               for i in range(n)]
    # Equal engines: no measured plateau (a timing) decides a move, so a run repeats exactly;
    # an idle engine still takes half of the other's last running requests (tail balancing).
    manager = RolloutManager(workers, config=ManagerConfig(plateau_batch=part.num_slots),
                             clock=clock)
  manager.publish(params, version, moe_state, base=base)
  return manager


def extra_groups(loop: LoopConfig) -> int:
  if loop.mode == "async":
    return 0
  return int(math.ceil(loop.prompts_per_step * loop.oversample)) - loop.prompts_per_step

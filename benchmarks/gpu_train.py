"""The train rows of `benchmarks.gpu`: one GRPO step timed the way the CLI runs it.

The CLI's step (`train.loop.local_step.LocalStep`) runs the jitted pieces of
`train.step.programs.train_programs` (`update.TrainFns`, buffers donated): a step of one
micro-batch as one program (`fused_step`), a larger step as micro-batches of at most m_b groups
(`batch.micro_batches`) whose gradients `accumulate` sums before one `apply`. Two rows per model:

- "1 program": `Sizes.train_single` (8 x 8 on a GPU) through `fused_step`;
- "N x m_b groups": `Sizes.train` (the issue's 32 x 8) in micro-batches of `Sizes.micro_groups`
  groups (the CLI default `--micro_batch_groups`), `init_accum` + `accumulate` per micro-batch +
  `apply`; MFU over the whole batch.

Each row reports the median step ms over `TRAIN_REPEATS` warm steps (the state threaded through,
as the loop does), MFU (`metrics_log.train_flops_per_token` over the device's bf16 peak) and the
largest compiled temp memory of the step's programs.
"""
from __future__ import annotations

import time
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import gpu_profile
from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.train.loop import metrics_log
from jaxrl_sys.train.step import batch as batch_lib

MiB = 2 ** 20
# Warm steps timed per row (at most): a step takes 0.2-1 s on an H100, five give a stable median.
TRAIN_REPEATS = 5


def train_batch(c: ModelConfig, groups: int, group: int, lp: int, lr: int, key):
  """A packed micro-batch `[groups * group, lp + lr]` of random tokens (every response token
  scored, random advantages), as `batch.pack` lays it out."""
  rows, t = groups * group, lp + lr
  tokens = jax.random.randint(key, (rows, t), 3, c.vocab_size)
  return batch_lib.TrainBatch(
      tokens=tokens, targets=tokens[:, lp:], attention_mask=jnp.ones_like(tokens),
      loss_mask=jnp.ones((rows, lr), jnp.float32),
      behav_logprobs=jnp.full((rows, lr), -5.0, jnp.float32),
      versions=jnp.zeros((rows, lr), jnp.int32), advantages=jax.random.normal(key, (rows,)),
      score_start=jnp.full((rows,), lp - 1, jnp.int32))


def _temp_mib(lowered) -> float:
  return lowered.compile().memory_analysis().temp_size_in_bytes / MiB


def _timed(step, state, repeats: int):
  """(median ms of `repeats` warm calls of `state = step(state)`, the last state)."""
  state = jax.block_until_ready(step(state))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    state = jax.block_until_ready(step(state))
    times.append(time.perf_counter() - t)
  return float(np.median(times)) * 1e3, state


def _train_row(c: ModelConfig, shape, micro_groups: int | None, fns, state, repeats: int,
             peak_flops: float, profile: dict | None, name: str):
  """One train row: `shape` = (prompts, group, lp, lr) as one program (micro_groups None) or
  as the CLI's micro-batches of at most `micro_groups` groups. Returns (row, state)."""
  prompts, group, lp, lr = shape
  if micro_groups is None:
    layout, impl = [(prompts, prompts)], "1 program"
  else:
    layout = batch_lib.micro_batches(prompts, micro_groups, fns.min_groups(group))
    impl = f"{len(layout)} x {micro_groups} groups"
  row = {"section": "train", "name": f"grpo step {name}", "impl": impl,
         "shape": f"{prompts}x{group}x({lp}+{lr})"}
  key = jax.random.PRNGKey(3)
  mbs = [fns.put_batch(train_batch(c, padded, group, lp, lr, jax.random.fold_in(key, i)))
         for i, (_, padded) in enumerate(layout)]
  if len(mbs) == 1:
    temps = [_temp_mib(fns.fused_step.lower(state, mbs[0]))]

    def step(st):
      return fns.fused_step(st, mbs[0])[0]
  else:
    acc = fns.init_accum(state, mbs[0])
    temps = [_temp_mib(fns.accumulate.lower(state, acc, mbs[0])),
             _temp_mib(fns.apply.lower(state, acc))]
    del acc

    def step(st):
      acc = fns.init_accum(st, mbs[0])
      for mb in mbs:
        acc = fns.accumulate(st, acc, mb)
      return fns.apply(st, acc)[0]
  ms, state = _timed(step, state, repeats)
  flops = metrics_log.train_flops_per_token(c, lp + lr, reference=False, scored_len=lr)
  tokens = prompts * group * (lp + lr)
  row |= {"step_ms": ms, "micro_batches": len(mbs), "fwdbwd_temp_mib": max(temps),
          "mfu": flops * tokens / (ms / 1e3) / peak_flops}
  if profile is not None and micro_groups is None and f"train {name}" not in profile:
    cell = [state]   # the state is donated: each traced call feeds the next

    def one():
      cell[0] = step(cell[0])
      return cell[0].step
    ops, tot = gpu_profile.profile_summary(one, calls=2, out_dir=profile["dir"] + "/train")
    profile[f"train {name}"] = ops
    profile.setdefault("totals", {})[f"train {name}"] = {
        "ms_per_step": tot["ms_per_call"], "kernels_per_step": tot["count_per_call"],
        "copy_share": tot["copy_share"], "update_slice_share": tot["update_slice_share"]}
    state = cell[0]
  return row, state


def train_section(s, info: dict, profile: dict | None = None) -> Iterator[dict]:
  """The train rows of `s` (a `benchmarks.gpu.Sizes`), as they are measured; see the module
  docstring."""
  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.sharding import make_mesh
  from jaxrl_sys.train.step.config import TrainConfig
  from jaxrl_sys.train.step.programs import train_programs
  from jaxrl_sys.train.step.state import init_train_state
  models_ = (("dense 0.5B", s.dense), ("Qwen3-MoE", s.moe))
  # --quick: the MoE model only (the same code; the dense step is compiled by the train tests).
  for name, c in models_[1:] if s.quick else models_:
    tc = TrainConfig()
    mesh = make_mesh("1")
    programs = train_programs(c, tc, c.param_dtype, mesh)   # the CLI's (`recipe.build`)
    state = None
    for shape, micro in ((s.train_single, None), (s.train, s.micro_groups)):
      try:
        if state is None:
          state = init_train_state(c, tc, programs.optimizer, mesh=mesh)
        row, state = _train_row(c, shape, micro, programs.fns, state,
                                min(s.repeats, TRAIN_REPEATS),
                              info["peak_flops"], profile, name)
      except Exception as e:  # pylint: disable=broad-except  # an OOM is the measurement
        prompts, group, lp, lr = shape
        row = {"section": "train", "name": f"grpo step {name}",
               "impl": "1 program" if micro is None else f"m_b={micro}",
               "shape": f"{prompts}x{group}x({lp}+{lr})",
               "error": f"{type(e).__name__}: {str(e)[:160]}"}
        state = None   # a failed step may have consumed the donated state
      yield row
    del state

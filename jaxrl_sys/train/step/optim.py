"""The optimizer: global-norm clipping, AdamW on a warm-up + decay schedule, ESS scaling.

The chain always ends with `losses.scale_by_ess()` so the optimizer state has one structure
for every algorithm; the step passes `lr_scale=1` unless VCPO scaling is selected (multiplying
by 1.0 is exact).
"""
from __future__ import annotations

import optax

from jaxrl_sys.losses.ess import scale_by_ess
from jaxrl_sys.train.step.config import OptimConfig


def make_schedule(config: OptimConfig) -> optax.Schedule:
  """Learning rate as a function of the optimizer step count."""
  peak, end = config.learning_rate, config.learning_rate * config.end_lr_ratio
  warm = config.warmup_steps
  if config.schedule == "constant" or config.decay_steps <= warm:
    if warm:
      return optax.join_schedules(
          [optax.linear_schedule(0.0, peak, warm), optax.constant_schedule(peak)], [warm])
    return optax.constant_schedule(peak)
  if config.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, warm, config.decay_steps, end)
  decay = optax.linear_schedule(peak, end, config.decay_steps - warm)
  if not warm:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warm), decay], [warm])


def make_optimizer(config: OptimConfig, *, ess_rule: str = "sqrt",
                   base_ess_ratio: float = 1.0) -> optax.GradientTransformationExtraArgs:
  """clip_by_global_norm -> AdamW(schedule) -> scale_by_ess, wrapped in
  `optax.apply_if_finite` when `config.skip_nonfinite` (a non-finite gradient leaves the
  parameters and the optimizer state unchanged).

  `update(grads, state, params, lr_scale=s)` must be given the ESS multiplier (1.0 = off).
  """
  parts = []
  if config.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip))
  parts.append(optax.adamw(make_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                           weight_decay=config.weight_decay))
  parts.append(scale_by_ess(rule=ess_rule, base_ess_ratio=base_ess_ratio))
  chain = optax.chain(*parts)
  if config.skip_nonfinite:
    # Never give up inside the optimizer: the loop's guard decides when to stop.
    return optax.apply_if_finite(chain, max_consecutive_errors=2**30)
  return chain

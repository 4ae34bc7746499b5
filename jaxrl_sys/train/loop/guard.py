"""Divergence guard: a non-finite loss or gradient never passes silently.

The loop calls `DivergenceGuard.check` on each step's metrics, logs them, and raises the error
it returns before anything is checkpointed. Default policy "stop": a `DivergenceError` (the
state of that step is not saved, so the newest checkpoint is the last good one). Policy "skip"
(`OptimConfig.skip_nonfinite`, where the optimizer itself drops updates whose gradient is not
finite, `optax.apply_if_finite`): the step is recorded as skipped (`update_skipped` metric) and
the run stops only after `max_skips` consecutive skips.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

# Metrics computed from the loss and the gradient of a step (see `train.step.update.apply`).
WATCHED = ("loss", "pg_loss", "grad_norm")
POLICIES = ("stop", "skip")


class DivergenceError(RuntimeError):
  """Training produced a non-finite loss or gradient.

  Attributes:
    step: the (1-based) step whose metrics were not finite.
    values: the offending metrics.
    last_checkpoint: the newest saved step (None when nothing was saved).
  """

  def __init__(self, message: str, step: int, values: Mapping[str, float],
               last_checkpoint: int | None):
    super().__init__(message)
    self.step, self.values, self.last_checkpoint = step, dict(values), last_checkpoint


def nonfinite(metrics: Mapping[str, Any], keys=WATCHED) -> dict[str, float]:
  """The entries of `metrics` among `keys` that are NaN or infinite."""
  out = {}
  for k in keys:
    v = metrics.get(k)
    if isinstance(v, (int, float)) and not math.isfinite(v):
      out[k] = float(v)
  return out


class DivergenceGuard:
  """Checks each step's metrics (see the module docstring).

  Args:
    policy: "stop" or "skip".
    max_skips: with "skip", the number of consecutive skipped updates that stops the run.
  """

  def __init__(self, policy: str = "stop", max_skips: int = 10):
    if policy not in POLICIES:
      raise ValueError(f"unknown non-finite policy {policy!r}; choose one of {POLICIES}")
    if max_skips < 1:
      raise ValueError(f"max_skips must be >= 1, got {max_skips}")
    self.policy, self.max_skips = policy, max_skips
    self.consecutive = 0
    self.total_skipped = 0

  def check(self, step: int, metrics: dict, checkpointer=None) -> DivergenceError | None:
    """The `DivergenceError` to raise for a non-finite step (policy "stop", or too many
    skips), else None; with "skip", sets `metrics["update_skipped"]` to 1.0 or 0.0.

    Args:
      step: the step just run (1-based).
      metrics: its metrics row (modified in place under "skip").
      checkpointer: the run's `Checkpointer` or None, to name the last good checkpoint.
    """
    bad = nonfinite(metrics)
    if self.policy == "skip":
      metrics["update_skipped"] = float(bool(bad))
      if not bad:
        self.consecutive = 0
        return None
      self.consecutive += 1
      self.total_skipped += 1
      if self.consecutive < self.max_skips:
        return None
    if not bad:
      return None
    last = None
    if checkpointer is not None:
      checkpointer.wait()
      last = checkpointer.latest_step()
    values = ", ".join(f"{k} {v}" for k, v in bad.items())
    where = (f"the last good checkpoint is step {last} in {checkpointer.directory}"
             if last is not None else "no checkpoint was saved")
    what = (f"{self.consecutive} consecutive updates skipped" if self.policy == "skip"
            else "the update was not checkpointed")
    return DivergenceError(
        f"training diverged at step {step}: {values} ({what}); {where}. Lower "
        "--learning_rate (or raise --lr_warmup_steps), or pass --skip_nonfinite to drop "
        "non-finite updates instead of stopping.", step, bad, last)

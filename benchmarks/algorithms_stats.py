"""The statistics of `benchmarks.algorithms`: a claim (`Comparison` of two cells' arms), the mean
and 95% t-interval of a metric, the paired effect and its verdict (the rule is in
`benchmarks.algorithms`' docstring), and the table rows built from them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from benchmarks.algorithms_cells import Cell

# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); 1.96 beyond.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def interval(values) -> tuple[float, float, float]:
  """(mean, low, high): the mean and its 95% t-interval (NaN bounds for fewer than 2 values)."""
  x = np.asarray(values, np.float64)
  m = float(x.mean())
  if x.size < 2:
    return m, math.nan, math.nan
  half = (T95[x.size - 2] if x.size - 1 <= len(T95) else 1.96) * float(x.std(ddof=1)) / math.sqrt(
      x.size)
  return m, m - half, m + half


def verdict(effect: tuple[float, float, float], delta: float) -> str:
  """The verdict of an oriented paired effect (mean, low, high); see the
  `benchmarks.algorithms` docstring."""
  _, lo, hi = effect
  if math.isnan(lo):
    return "not measurable at this scale (one seed)"
  if lo > 0:
    return "reproduced"
  if hi < 0:
    return "not reproduced (reversed)"
  if -delta < lo and hi < delta:
    return f"not reproduced (no effect >= {delta:g})"
  return "not measurable at this scale"


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Claim: arm `b` beats arm `a` on `metric` (higher if `sign` > 0, lower if < 0) by more than
  `delta` (the smallest effect of interest). `inactive(a_runs, b_runs)` names a reason the
  mechanism cannot act in these runs (verdict "not measurable"), or None."""
  regime: str
  claim: str
  setting: str
  metric: str
  a: Cell
  b: Cell
  sign: int
  delta: float
  inactive: Callable[[list, list], str | None] | None = None


def fmt(m: tuple[float, float, float], digits: int = 3) -> str:
  """`mean [low, high]` of (mean, low, high) (the mean alone without bounds)."""
  mean, lo, hi = m
  if math.isnan(lo):
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def compare(c: Comparison, runs: dict) -> dict:
  """The table row of `c` from the per-seed runs of its arms (paired by seed)."""
  a_runs, b_runs = runs[c.a.name], runs[c.b.name]
  a = np.array([r[c.metric] for r in a_runs])
  b = np.array([r[c.metric] for r in b_runs])
  effect = interval(c.sign * (b - a))
  reason = c.inactive(a_runs, b_runs) if c.inactive else None
  row = {"regime": c.regime, "claim": c.claim, "setting": c.setting, "metric": c.metric,
         "A": c.a.name, "B": c.b.name, "A_mean_ci": interval(a), "B_mean_ci": interval(b),
         "effect_ci": effect, "delta": c.delta,
         "verdict": reason or verdict(effect, c.delta), "seeds": len(a),
         "A_values": a.tolist(), "B_values": b.tolist()}
  if "collapse_step" in a_runs[0]:
    row["collapsed"] = [sum(r["collapse_step"] is not None for r in x) for x in (a_runs, b_runs)]
    if row["collapsed"] == [len(a), len(b)]:
      row["verdict"] += " (both arms collapse in every seed)"
  if c.regime == "vcpo":
    row["staleness_mean"] = float(np.mean([r["staleness_mean"] for r in a_runs + b_runs]))
    row["B_lr_scale_mean"] = float(np.mean([r["lr_scale_mean"] for r in b_runs]))
  if c.regime == "dapo":  # the clip binds: the share of tokens clipped, mean over the steps
    row["clip_frac_mean"] = [float(np.mean([r["clip_frac_mean"] for r in x]))
                             for x in (a_runs, b_runs)]
    row["clip_frac_high_mean"] = [float(np.mean([r["clip_frac_high_mean"] for r in x]))
                                  for x in (a_runs, b_runs)]
    row["eval_reward"] = [interval([r["eval_reward"] for r in x]) for x in (a_runs, b_runs)]
    row["entropy_curve_max_abs_diff"] = float(max(
        np.max(np.abs(np.subtract(x["entropy"], y["entropy"]))) for x, y in zip(a_runs, b_runs)))
  return row


def collapse_row(c: Cell, runs: list) -> dict:
  steps = [r["collapse_step"] for r in runs]
  return {"run": c.name, "settings": dict(c.settings), "seeds": len(runs),
          "note_fired": sum(r["collapse_notes"] > 0 for r in runs),
          "rule_fired": sum(s is not None for s in steps), "onset_steps": steps,
          "notes_per_run": [r["collapse_notes"] for r in runs],
          "reward_last": interval([r["reward_last"] for r in runs]),
          "entropy_last": interval([r["entropy_last"] for r in runs])}

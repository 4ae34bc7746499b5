"""Policy-collapse watch: a run whose learning signal is gone says so once, with the causes.

GRPO-family losses learn from the differences between the samples of a group; a group whose
samples all score alike has zero advantage and adds no policy gradient. A policy that collapses
(off-policy drift without a KL anchor, a learning rate too high) ends there: either its entropy
falls to ~0 and it samples the same completion every time, or its outputs degenerate (entropy
up, responses run to the length limit) and every sample scores 0. The reward falls, the
gradient vanishes, and the run would train on silently. `collapse_onset` recognises it from the
per-step metrics rows; `CollapseWatch` (called by the loop on each row) prints the note once.

The rule, over consecutive rows (`CollapseRule` holds the numbers):

  * the *window* is the last `patience` (5) steps;
  * the reward has *fallen* when the window's mean `reward_mean` is at most
    `peak - max(drop * |peak|, min_drop)` (drop 0.5, min_drop 0.05), where `peak` is the best
    mean `reward_mean` of any earlier `patience`-step window of the run (so a run that never
    had reward, or one that holds its best, never qualifies);
  * the signal is *gone* when the window's mean `zero_variance_frac` (the share of groups
    whose samples all scored alike) is at least `uniform_frac` (0.9), or its mean `entropy`
    (nats per token) is at most `entropy_floor` (0.1);
  * the run has collapsed at the first step where the reward has fallen and the signal is gone.

A row missing a key (or holding NaN) leaves that condition false. The rule reads only what
the loop logs for every run, whatever the task; it assumes larger rewards are better.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, NamedTuple, Sequence


@dataclasses.dataclass(frozen=True)
class CollapseRule:
  """The numbers of the rule (see the module docstring).

  Attributes:
    patience: steps in the window (the collapse must last that long).
    drop: the window's mean reward is at most `peak - drop * |peak|` ...
    min_drop: ... and at most `peak - min_drop`.
    uniform_frac: mean share of all-alike groups at or above which the signal is gone.
    entropy_floor: mean token entropy (nats) at or below which the signal is gone.
  """
  patience: int = 5
  drop: float = 0.5
  min_drop: float = 0.05
  uniform_frac: float = 0.9
  entropy_floor: float = 0.1

  def __post_init__(self):
    if self.patience < 1:
      raise ValueError(f"CollapseRule.patience must be >= 1, got {self.patience}")
    if not (0 <= self.drop <= 1 and self.min_drop >= 0):
      raise ValueError(f"CollapseRule needs 0 <= drop <= 1 and min_drop >= 0, got "
                       f"{self.drop}, {self.min_drop}")
    if not 0 < self.uniform_frac <= 1:
      raise ValueError(f"CollapseRule.uniform_frac must be in (0, 1], got {self.uniform_frac}")


class Onset(NamedTuple):
  """Where and how a run collapsed (indices are positions in the rows given).

  index: the row at which the rule first holds; start: the window's first row; peak / peak_start:
  the best earlier window mean reward and its first row; reward, uniform, entropy, stop: the
  window's means of reward_mean, zero_variance_frac, entropy and stop_frac (NaN when not
  logged); entropy_start: mean entropy of the run's first window (NaN when not logged).
  """
  index: int
  start: int
  peak: float
  peak_start: int
  reward: float
  uniform: float
  entropy: float
  stop: float
  entropy_start: float


_KEYS = ("reward_mean", "zero_variance_frac", "entropy", "stop_frac")


def _mean(rows: Sequence[Mapping], key: str) -> float:
  vals = []
  for r in rows:
    v = r.get(key)
    if not isinstance(v, (int, float)) or not math.isfinite(v):
      return math.nan
    vals.append(float(v))
  return sum(vals) / len(vals) if vals else math.nan


def _judge(window: Sequence[Mapping], start: int, peak: float, peak_start: int,
           rule: CollapseRule) -> tuple[float, int, Onset | None]:
  """One window (rows `start`..`start + patience - 1`) against the best earlier window:
  (the peak including this window, its start, the onset if the rule holds here)."""
  reward = _mean(window, "reward_mean")
  if peak_start >= 0 and math.isfinite(reward):
    fallen = reward <= peak - max(rule.drop * abs(peak), rule.min_drop)
    uniform, entropy = _mean(window, "zero_variance_frac"), _mean(window, "entropy")
    if fallen and (uniform >= rule.uniform_frac or entropy <= rule.entropy_floor):
      return peak, peak_start, Onset(start + len(window) - 1, start, peak, peak_start, reward,
                                     uniform, entropy, _mean(window, "stop_frac"), math.nan)
  if math.isfinite(reward) and reward > peak:
    peak, peak_start = reward, start
  return peak, peak_start, None


def collapse_onset(rows: Sequence[Mapping], rule: CollapseRule = CollapseRule()) -> Onset | None:
  """The first point where `rows` (per-step metrics, oldest first) meet the collapse rule
  (module docstring), or None.

  Args:
    rows: metrics rows with `reward_mean`, `zero_variance_frac` and `entropy` (what `RLLoop`
      logs); `stop_frac` is read for the description.
    rule: the thresholds.
  """
  k = rule.patience
  peak, peak_start = -math.inf, -1
  for start in range(len(rows) - k + 1):
    peak, peak_start, onset = _judge(rows[start:start + k], start, peak, peak_start, rule)
    if onset is not None:
      return onset._replace(entropy_start=_mean(rows[:k], "entropy"))
  return None


def collapse_note(onset: Onset, first_step: int = 1) -> str:
  """The message for `onset`: what happened, the usual causes and what to do.

  Args:
    onset: from `collapse_onset`.
    first_step: the step number of the first row (the loop's rows start at step 1; a resumed
      run's at the step after its checkpoint).
  """
  o, s = onset, first_step
  what = (f"policy collapse at step {o.index + s}: over steps {o.start + s}-{o.index + s} the "
          f"reward averaged {o.reward:.3f} (best {o.peak:.3f}, steps {o.peak_start + s}-"
          f"{o.peak_start + s + o.index - o.start})")
  if math.isfinite(o.uniform):
    what += (f" and {o.uniform:.0%} of the groups scored all alike (zero advantage: no policy "
             "gradient)")
  if math.isfinite(o.entropy) and o.entropy <= 0.1:
    how = (f"the policy entropy collapsed to {o.entropy:.3f} nats/token (from "
           f"{o.entropy_start:.2f}): it samples the same completion every time")
  elif (math.isfinite(o.entropy) and math.isfinite(o.stop) and o.stop < 0.5
        and not o.entropy < o.entropy_start):
    how = (f"the outputs degenerated: entropy {o.entropy:.2f} nats/token (from "
           f"{o.entropy_start:.2f}) and only {o.stop:.0%} of the responses end before the "
           "length limit")
  else:
    how = f"entropy {o.entropy:.2f} nats/token (from {o.entropy_start:.2f})"
  return (f"{what}; {how}. The run goes on but rarely recovers. Usual causes: no KL anchor "
          "(--kl_coef=0; the dapo, drgrpo and vcpo presets) with a high --learning_rate, stale "
          "samples (--mode=async with a large --max_staleness). Rerun with a lower "
          "--learning_rate, --kl_coef=0.04 or a lower --max_staleness (docs/algorithms.md).")


class CollapseWatch:
  """Checks each step's metrics row and reports a collapse once (see the module docstring);
  `collapse_onset` over the same rows gives the same onset. Keeps the last `patience` rows.

  Args:
    report: called with the note (the loop passes its `Progress.message`).
    rule: the thresholds.
  """

  def __init__(self, report: Callable[[str], None], rule: CollapseRule = CollapseRule()):
    self.report, self.rule = report, rule
    self.window: list[dict] = []
    self.count = 0                      # rows seen
    self.first_step: int | None = None  # the step of the first row
    self.entropy_start = math.nan
    self.peak, self.peak_start = -math.inf, -1
    self.onset: Onset | None = None

  def check(self, step: int, row: Mapping) -> str | None:
    """Adds the row of `step`; returns (and reports) the note the first time the rule holds."""
    if self.onset is not None:
      return None
    if self.first_step is None:
      self.first_step = int(step)
    k = self.rule.patience
    self.window = (self.window + [{key: row.get(key) for key in _KEYS}])[-k:]
    self.count += 1
    if self.count < k:
      return None
    if self.count == k:
      self.entropy_start = _mean(self.window, "entropy")
    self.peak, self.peak_start, onset = _judge(self.window, self.count - k, self.peak,
                                               self.peak_start, self.rule)
    if onset is None:
      return None
    self.onset = onset._replace(entropy_start=self.entropy_start)
    note = collapse_note(self.onset, self.first_step)
    self.report(note)
    return note

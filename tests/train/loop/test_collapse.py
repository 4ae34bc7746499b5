"""The policy-collapse rule on synthetic metric sequences, against a brute-force reference, and
the watch the loop calls (one note, at the rule's onset)."""
import math

import numpy as np
import pytest

from jaxrl_sys.train.loop.collapse import (CollapseRule, CollapseWatch, collapse_note,
                                           collapse_onset)


def reference_onset(rows, k=5, drop=0.5, min_drop=0.05, uniform=0.9, ent_floor=0.1):
  """The rule written out directly: every window ending at t against every earlier window."""
  def mean(window, key):
    vals = [r.get(key) for r in window]
    if any(v is None or not math.isfinite(v) for v in vals):
      return math.nan
    return float(np.mean(vals))
  for t in range(k - 1, len(rows)):
    window = rows[t - k + 1:t + 1]
    earlier = [mean(rows[s:s + k], "reward_mean") for s in range(t - k + 1)]
    earlier = [x for x in earlier if math.isfinite(x)]
    reward = mean(window, "reward_mean")
    if not earlier or math.isnan(reward):
      continue
    peak = max(earlier)
    fallen = reward <= peak - max(drop * abs(peak), min_drop)
    gone = (mean(window, "zero_variance_frac") >= uniform
            or mean(window, "entropy") <= ent_floor)
    if fallen and gone:
      return t
  return None


def rows_of(reward, zvf, entropy, stop=None):
  stop = [1.0] * len(reward) if stop is None else stop
  return [{"reward_mean": r, "zero_variance_frac": z, "entropy": e, "stop_frac": s}
          for r, z, e, s in zip(reward, zvf, entropy, stop)]


def test_healthy_run_never_fires():
  # The quick-start shape: reward rising 0.3 -> 0.6, a third of the groups uniform.
  n = 100
  rows = rows_of(np.linspace(0.3, 0.6, n), [0.3] * n, np.linspace(0.8, 0.5, n))
  assert collapse_onset(rows) is None and reference_onset(rows) is None


def test_degenerate_outputs_fire_at_the_fifth_stuck_step():
  # Steps 1-10 healthy at 0.3; from step 11 reward 0, all groups uniform, entropy up, no eos.
  rows = rows_of([0.3] * 10 + [0.0] * 10, [0.3] * 10 + [1.0] * 10, [0.8] * 10 + [1.5] * 10,
                 [1.0] * 10 + [0.05] * 10)
  onset = collapse_onset(rows)
  # The window 11..15 is the first whose mean reward (0) is <= 0.3 - 0.15 with zvf 1.
  assert onset.index == 14 == reference_onset(rows)
  assert onset.start == 10 and onset.peak == pytest.approx(0.3) and onset.peak_start == 0
  note = collapse_note(onset)
  assert note.startswith("policy collapse at step 15: over steps 11-15")
  assert "outputs degenerated" in note and "5% of the responses" in note
  assert "--kl_coef=0.04" in note and "(best 0.300, steps 1-5)" in note


def test_entropy_collapse_fires_through_the_entropy_branch():
  # Reward 0.5 -> 0.2 while entropy -> 0.02; only 60% of groups uniform (long responses
  # differ), so the entropy floor, not the uniform share, marks the signal gone.
  rows = rows_of([0.5] * 8 + [0.2] * 8, [0.2] * 8 + [0.6] * 8, [0.7] * 8 + [0.02] * 8)
  onset = collapse_onset(rows)
  assert onset.index == reference_onset(rows) == 12
  assert "entropy collapsed to 0.020" in collapse_note(onset)


def test_no_fire_without_a_fall_or_with_a_signal():
  n = 30
  never_learned = rows_of([0.0] * n, [1.0] * n, [0.0] * n)         # no earlier reward to lose
  solved = rows_of([1.0] * n, [1.0] * n, [0.01] * n)                # at its best, not fallen
  fell_but_learning = rows_of([0.6] * 10 + [0.1] * 20, [0.3] * n, [0.8] * n)
  short_dip = rows_of([0.4] * 10 + [0.0] * 4 + [0.4] * 16,          # 4 stuck steps < patience
                      [0.3] * 10 + [1.0] * 4 + [0.3] * 16, [0.8] * n)
  tiny_peak = rows_of([0.04] * 10 + [0.0] * 20, [1.0] * n, [0.8] * n)  # drop < min_drop 0.05
  for rows in (never_learned, solved, fell_but_learning, short_dip, tiny_peak):
    assert collapse_onset(rows) is None and reference_onset(rows) is None


def test_missing_or_nan_metrics_do_not_fire():
  rows = rows_of([0.3] * 10 + [0.0] * 10, [0.3] * 10 + [1.0] * 10, [0.8] * 10 + [1.5] * 10)
  for r in rows[10:]:
    del r["zero_variance_frac"]
  assert collapse_onset(rows) is None                 # entropy 1.5: the other branch is false
  rows = rows_of([0.3] * 10 + [math.nan] * 10, [0.3] * 10 + [1.0] * 10, [0.8] * 20)
  assert collapse_onset(rows) is None


def test_random_sequences_match_the_reference_and_the_watch():
  rng = np.random.default_rng(0)
  fired = 0
  for _ in range(300):
    n = int(rng.integers(3, 40))
    level = rng.uniform(0, 1)
    cut = int(rng.integers(0, n))
    reward = np.where(np.arange(n) < cut, level, level * rng.uniform(0, 1))
    reward = np.clip(reward + rng.normal(0, 0.05, n), -0.2, 1)
    zvf = np.where(np.arange(n) < cut, rng.uniform(0, 1, n), rng.uniform(0.8, 1, n))
    ent = np.where(np.arange(n) < cut, rng.uniform(0.3, 1, n), rng.uniform(0, 0.3, n))
    rows = rows_of(reward.tolist(), zvf.tolist(), ent.tolist())
    onset = collapse_onset(rows)
    want = reference_onset(rows)
    assert (onset and onset.index) == want
    notes = []
    watch = CollapseWatch(notes.append)
    for step, row in enumerate(rows, start=7):          # a resumed run's rows start later
      watch.check(step, row)
    if want is None:
      assert notes == [] and watch.onset is None
    else:
      fired += 1
      assert notes == [collapse_note(onset, first_step=7)]
      assert notes[0].startswith(f"policy collapse at step {want + 7}:")
  assert 30 < fired < 270  # both outcomes exercised


def test_rule_validation():
  with pytest.raises(ValueError, match="patience"):
    CollapseRule(patience=0)
  with pytest.raises(ValueError, match="uniform_frac"):
    CollapseRule(uniform_frac=0.0)
  custom = CollapseRule(patience=2, uniform_frac=0.5)
  rows = rows_of([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.6, 0.6], [0.8] * 4)
  assert collapse_onset(rows, custom).index == 3 == reference_onset(rows, k=2, uniform=0.5)
  assert collapse_onset(rows) is None

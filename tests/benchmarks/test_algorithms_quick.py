"""`benchmarks.algorithms --quick` on the regimes the CI budget holds (MoE balancing and the
collapse note): its table and JSON, BIP's balance, and the policy-collapse note: once on the
no-KL stress run, never on the quick-start settings."""
import json
import math

from benchmarks import algorithms, common


def test_algorithms_quick(tmp_path, monkeypatch):
  monkeypatch.setattr(common, "RESULTS_DIR", str(tmp_path))
  algorithms.main(["--quick", "--only", "moe,collapse", "--out", "algo_test"])
  saved = json.loads((tmp_path / "algo_test.json").read_text())
  assert saved["quick"] and saved["regimes"] == ["moe", "collapse"]
  seeds = saved["sizes"]["seeds"]
  rows = saved["rows"]
  assert [r["regime"] for r in rows] == ["moe"] * 4
  for r in rows:
    assert set(r) >= {"claim", "setting", "metric", "A", "B", "A_mean_ci", "B_mean_ci",
                      "effect_ci", "verdict", "A_values", "B_values"}
    assert len(r["A_values"]) == len(r["B_values"]) == r["seeds"] == seeds
    mean, lo, hi = r["effect_ci"]
    assert lo <= mean <= hi
    assert r["verdict"].startswith(("reproduced", "not reproduced", "not measurable"))
  # BIP routes to balance every batch: far below the other methods' MaxVio in every seed.
  runs = saved["runs"]
  bip = [r["maxvio_mean"] for r in runs["moe bip"]]
  others = [r["maxvio_mean"] for m in ("aux_loss", "aux_free") for r in runs[f"moe {m}"]]
  assert max(bip) < 0.5 * min(others), (bip, others)
  # The no-KL stress run (async, max_staleness 8, lr 5e-3, KL 0) collapses; the loop says so
  # once per run, where the rule (recomputed from the history) puts the onset.
  col, calm = saved["collapse"]
  n = saved["sizes"]["collapse_seeds"]
  assert col["run"] == "stress grpo kl=0" and col["notes_per_run"] == [1] * n
  assert col["rule_fired"] == n and all(s is not None for s in col["onset_steps"])
  assert all(math.isfinite(r["reward_last"]) and r["reward_last"] < 0.1
             for r in runs["stress grpo kl=0"])
  # The quick start's settings (sync, KL 0.04, lr 1e-3) keep learning: no note, and the
  # reward it ends with is well above the collapsed run's.
  assert calm["run"] == "quick-start defaults" and calm["notes_per_run"] == [0] * n
  assert calm["rule_fired"] == 0
  assert min(r["reward_last"] for r in runs["quick-start defaults"]) > 0.2

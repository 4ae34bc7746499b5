"""`benchmarks.algorithms --quick` on the regimes the CI budget holds (MoE balancing and the
collapse note): its table and JSON, BIP's balance, and the policy-collapse note on the no-KL
stress run."""
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
  (col,) = saved["collapse"]
  assert col["run"] == "stress grpo kl=0" and col["notes_per_run"] == [1] * seeds
  assert col["rule_fired"] == seeds and all(s is not None for s in col["onset_steps"])
  assert all(math.isfinite(r["reward_last"]) and r["reward_last"] < 0.1
             for r in runs["stress grpo kl=0"])

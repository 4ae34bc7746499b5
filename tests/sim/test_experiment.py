"""`python -m experiments.spot_sim` end to end on a short run, and the trace segmentation."""
import json
import os
import subprocess
import sys

import pytest

from jaxrl_sys.rollout.elastic.traces import load_bamboo
from jaxrl_sys.sim import experiment, report

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
P3 = os.path.join(_REPO, "..", "shared", "traces", "bamboo", "p3-trace.csv")


def test_p3_sampled_like_rlboost_cuts_into_five_two_hour_segments():
  trace = load_bamboo(P3).sample(0.5, 0)
  assert len(trace.nodes) == round(0.5 * 177)
  segs = experiment.segments(trace, 2.0)
  assert [n for n, _ in segs] == ["0-2h", "2-4h", "4-6h", "6-8h", "8-10h"]
  for _, s in segs:
    assert s.end == 7200.0 and 0 < s.max_live() <= trace.max_live()


def test_the_experiment_prints_tables_and_writes_json_and_plots(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "experiments.spot_sim", "--preset=qwen3-8b",
       "--settings=rlboost,no_balance", "--segments=0", "--max_steps=2", "--jobs=1",
       f"--out_dir={tmp_path}"], cwd=_REPO, capture_output=True, text=True, timeout=120,
      check=True).stdout
  assert "RLBoost vs co-located veRL" in out and "no continuous balancing" in out
  res = json.loads((tmp_path / "results.json").read_text())
  assert res["meta"]["segments"].keys() == {"0-2h"}
  assert {(r["setting"], r["segment"]) for r in res["runs"]} == {
      ("colocated", None), ("rlboost", "0-2h"), ("no_balance", "0-2h")}
  assert all(len(r["result"]["steps"]) == 2 for r in res["runs"])
  assert res["summary"]["qwen3-8b"]["colocated"]["mean"]["x_throughput"] == 1.0
  assert (tmp_path / "qwen3-8b.png").stat().st_size > 1000


def test_a_baseline_without_a_single_step_is_a_clear_error():
  rows = [{"preset": "slow", "setting": "colocated", "segment": None,
           "result": {"steps": [], "throughput": 0.0, "tokens_per_dollar": 0.0, "wall_s": 0.0,
                      "cost_per_mtok": float("inf")}}]
  with pytest.raises(ValueError, match="completed no RL step.*--length_median"):
    report.summarize(rows, ["0-2h"])

"""`python -m experiments.spot_sim` end to end on a short run, and the trace segmentation."""
import json
import os
import subprocess
import sys

import pytest

from jaxrl_sys.rollout.elastic.trace_formats import bundled_trace, load_bamboo
from jaxrl_sys.sim import experiment, report

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
P3 = bundled_trace("bamboo/p3-trace.csv")


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
       "--length_median=1500",
       f"--out_dir={tmp_path}"], cwd=_REPO, capture_output=True, text=True, timeout=400,
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


def test_a_trace_shorter_than_a_segment_runs_as_one_segment_and_bad_indices_are_clear():
  from jaxrl_sys.rollout.elastic.traces import constant_trace  # pylint: disable=import-outside-toplevel
  short = constant_trace(3, 1200.0, "short")
  hours, segs = experiment.plan_segments(short, 2.0)
  assert hours == pytest.approx(1 / 3) and len(segs) == 1 and segs[0][1].end == 1200.0
  assert experiment.plan_segments(short, 2.0, "0")[1][0][0] == segs[0][0]
  with pytest.raises(ValueError, match=r"no segment \[1\]: the trace has 1 segment"):
    experiment.plan_segments(short, 2.0, "0,1")
  with pytest.raises(ValueError, match="spans 0 s"):
    experiment.plan_segments(constant_trace(3, 0.0, "empty"), 2.0, "0")
  hours, segs = experiment.plan_segments(constant_trace(1, 3 * 3600.0), 1.0, "2")
  assert hours == 1.0 and [n for n, _ in segs] == ["2-3h"]

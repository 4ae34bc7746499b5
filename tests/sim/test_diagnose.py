"""The held-out diagnostics (`sim.diagnose`): implied fleet, per-step means, the fleet cap."""
import dataclasses

import pytest

from jaxrl_sys.sim import diagnose
from jaxrl_sys.sim.driver import Simulation, SimConfig, simulate
from jaxrl_sys.sim.presets import QWEN3_8B
from jaxrl_sys.sim.prices import Prices
from tests.sim.common import small, spot_trace


def test_implied_spot_instances_by_hand():
  # 8B, one 8xH100 node at $83.79/h, 2xH100 spot at $5.32/h; the paper's 1.66x and +34%:
  # RLBoost's spend per hour is 1.66 / 1.34 = 1.238806 times veRL's $83.79, i.e. $20.0096/h of
  # spot = 3.7612 instances. 32B on two nodes: 1.51 / 1.28 = 1.1796875, 0.1796875 x 167.58 =
  # $30.112/h = 5.6602 instances.
  assert diagnose.implied_spot_instances(1.66, 1.34, 1) == pytest.approx(20.0096 / 5.32, rel=1e-4)
  assert diagnose.implied_spot_instances(1.51, 1.28, 2) == pytest.approx(30.1120 / 5.32, rel=1e-4)
  # No throughput gain bought at no cost gain: the spend is unchanged, no spot instance.
  assert diagnose.implied_spot_instances(1.3, 1.3, 1) == pytest.approx(0.0)
  # Prices enter as $/GPU-h: a $1/GPU-h on-demand, $0.5/GPU-h spot; x / ce = 1.5 -> 0.5 x 8 / 1.
  assert diagnose.implied_spot_instances(1.5, 1.0, 1, Prices(1.0, 0.5)) == pytest.approx(4.0)
  with pytest.raises(ValueError, match="ce > 0"):
    diagnose.implied_spot_instances(1.5, 0.0, 1)


def test_implied_counts_use_each_presets_nodes():
  n = diagnose.implied_counts()
  assert n["8B"] == pytest.approx(3.7612, abs=1e-3)
  assert n["14B"] == pytest.approx((1.97 / 1.49 - 1) * 83.79 / 5.32, rel=1e-9)
  assert n["32B"] == pytest.approx(5.6602, abs=1e-3)


def test_max_spot_instances_caps_the_fleet_and_defaults_off():
  # Twelve instances available throughout, the controller alone lets more than two run
  # (test_driver: its cap starts at N_resv = 4); capped at two, never more than two at once.
  assert SimConfig(QWEN3_8B).max_spot_instances is None
  with pytest.raises(ValueError, match="max_spot_instances"):
    SimConfig(QWEN3_8B, max_spot_instances=0)
  sim = Simulation(dataclasses.replace(small(max_steps=2), max_spot_instances=2),
                   spot_trace(12, 1e6))
  seen = []
  sim.manager.add_tick_hook(lambda m, now: seen.append(len(sim.fleet.workers)))
  res = sim.run()
  assert max(seen) == 2 and all(s.remote_live <= 2 for s in res.steps)
  free = simulate(small(max_steps=1), spot_trace(12, 1e6))
  assert free.steps[0].remote_live == 4


def test_step_means_average_the_records_and_bill_as_the_result_does():
  res = simulate(small(max_steps=3), spot_trace(3, 1e6))
  js = res.to_json()
  m = diagnose.step_means(js, nodes=1)
  steps = res.steps
  assert m["steps"] == 3
  assert m["duration"] == pytest.approx(sum(s.end - s.start for s in steps) / 3, rel=1e-5)
  assert m["last_done_in_step"] == pytest.approx(
      sum(s.last_done - s.start for s in steps) / 3, rel=1e-5)
  # The unrounded N_prem is recorded, and the integer cap is its floor.
  assert all(s.n_prem_cap == max(1, int(s.n_prem + 1e-9)) for s in steps)
  # Spot + reserved dollars per hour x hours = the run's cost.
  assert (m["spot_per_h"] + m["reserved_per_h"]) * res.wall / 3600 == pytest.approx(res.cost,
                                                                                     rel=1e-4)


def test_summarize_divides_each_run_by_its_own_segments_colocated_run():
  def run(preset, setting, segment, thr, tpd):
    step = dict(workers_used=2.0, n_prem=3.0, t_seed=10.0, t_wait_train=1.0, t_wait_remote=2.0,
                t_train=5.0, start=0.0, last_done=8.0, end=20.0)
    return {"preset": preset, "setting": setting, "segment": segment,
            "result": {"preset": preset, "steps": [step], "wall_s": 3600.0,
                       "spot_instance_hours": 1.0, "throughput": thr, "tokens_per_dollar": tpd}}
  rows = [run("qwen3-8b", "colocated", "0-2h", 100.0, 10.0),
          run("qwen3-8b", "rlboost", "0-2h", 200.0, 12.0),
          run("qwen3-8b", "colocated", "2-4h", 50.0, 5.0),
          run("qwen3-8b", "rlboost", "2-4h", 150.0, 7.5)]
  s = diagnose.summarize(rows)["8B"]
  assert s["rlboost"]["x"] == pytest.approx((2.0 + 3.0) / 2)      # 200/100 and 150/50
  assert s["rlboost"]["ce"] == pytest.approx((1.2 + 1.5) / 2)
  per = diagnose.summarize(rows, per_segment=True)["8B"]
  assert per["rlboost 2-4h"]["x"] == pytest.approx(3.0)
  assert "x" not in per["colocated 0-2h"] and per["colocated 2-4h"]["steps"] == 1
  assert diagnose.table(diagnose.summarize(rows, per_segment=True)).count("colocated") == 2
  # As the grid runs it: one co-located run without a segment stands for every segment (it
  # does not use the trace); `spot_sim --diagnose` printed only the co-located rows.
  grid = [run("qwen3-8b", "colocated", None, 100.0, 10.0), rows[1], rows[3]]
  s = diagnose.summarize(grid)["8B"]
  assert s["rlboost"]["x"] == pytest.approx((2.0 + 1.5) / 2)
  assert s["rlboost"]["ce"] == pytest.approx((1.2 + 0.75) / 2)

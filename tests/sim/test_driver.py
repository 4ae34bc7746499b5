"""The simulator's acceptance properties: zero spot = co-located exactly, migration beats restart
at every preemption point, it runs the real manager / controller / balancer objects, and it is
deterministic."""
import dataclasses
import json
import math

import pytest

from jaxrl_sys.rollout import manager
from jaxrl_sys.rollout.elastic import fleet, offload
from jaxrl_sys.rollout.manager import balance
from jaxrl_sys.rollout.manager import core as manager_core
from jaxrl_sys.rollout.manager import requests as manager_requests
from jaxrl_sys.rollout.elastic.traces import ADD, Trace, TraceEvent, constant_trace
from jaxrl_sys.sim import driver
from jaxrl_sys.sim.driver import Simulation, simulate
from tests.sim.common import small, spot_trace, with_manager, with_offload


def _strip(res):
  d = res.to_json()
  d.pop("mode")
  d["series"].pop("available", None)
  return d


def test_zero_spot_rlboost_equals_the_colocated_baseline_exactly():
  rl = simulate(small("rlboost"), constant_trace(0, 1e6))
  co = simulate(small("colocated"))
  assert len(co.steps) == 3 and co.throughput > 0
  assert json.dumps(_strip(rl), sort_keys=True) == json.dumps(_strip(co), sort_keys=True)


def _step1(cfg, trace):
  res = simulate(cfg, trace)
  return res.steps[1]


def _busiest_nodes(cfg, trace, t, k):
  """The `k` trace nodes whose instances hold the most requests at time `t` (undisturbed)."""
  sim, seen = Simulation(cfg, trace), {}

  def look(m, now):
    if now >= t and not seen:
      seen.update({wid: len(ws.assigned) for wid, ws in m.fleet.items()
                   if wid.startswith("spot-")})

  sim.manager.add_tick_hook(look)
  sim.run()
  busiest = sorted(seen, key=lambda w: (-seen[w], w))[:k]
  return [int(w.split("-n")[1].split(".")[0]) for w in busiest]


@pytest.mark.parametrize("frac", [0.25, 0.5, 0.75])
def test_token_migration_has_less_overhead_than_restart_from_prompt(frac):
  # Four spot instances; offload everything (T_seed = 0) so the generation phase of step 1 runs
  # on them; the two busiest are preempted at `frac` of that phase (RLBoost: 3 of 6 at once).
  cfg = with_offload(small(max_steps=2), fixed=0.0)
  sim = Simulation(cfg, spot_trace(4, 1e6))
  ref = sim.run().steps[1]
  begin = max(e[0] for e in sim.manager.fleet.events if e[1] == "pulled" and e[0] < ref.end)
  t_p = begin + frac * (ref.last_done - begin)  # the spot instances generate from `begin`
  nodes = _busiest_nodes(cfg, spot_trace(4, 1e6), t_p, 2)
  trace = spot_trace(4, 1e6, removes=tuple((t_p, i) for i in nodes))
  mig = _step1(cfg, trace)
  rst = _step1(with_manager(cfg, migrate_tokens=False), trace)
  over_mig, over_rst = mig.duration - ref.duration, rst.duration - ref.duration
  assert mig.delta["lost"] == rst.delta["lost"] == 2 and mig.delta["migrated"] > 0
  assert mig.delta["tokens_kept"] > 0 and rst.delta["tokens_discarded"] > 0
  assert over_mig < over_rst, (frac, over_mig, over_rst)


def test_the_simulator_runs_the_real_manager_controller_and_balancer(monkeypatch):
  assert driver.RolloutManager is manager.RolloutManager
  assert driver.OffloadDriver is offload.OffloadDriver and driver.Fleet is fleet.Fleet
  calls = {}

  def count(mod, name):
    real = getattr(mod, name)

    def wrapped(*a, **k):
      calls[name] = calls.get(name, 0) + 1
      return real(*a, **k)

    monkeypatch.setattr(mod, name, wrapped)

  for name in ("select_worker", "pending_moves", "running_moves", "tail_moves", "plateau_batch"):
    count(balance, name)
  count(offload, "offload_update")
  count(manager_core.ManagerCore, "on_lost")
  count(manager_requests.RequestTable, "cut_migrated")
  cfg = small(max_steps=4)
  sim = Simulation(cfg, spot_trace(6, 1e6, removes=((30.0, 0), (30.0, 1), (45.0, 2), (50.0, 3))))
  assert type(sim.manager) is manager.RolloutManager
  assert isinstance(sim.driver, offload.OffloadDriver) and isinstance(sim.fleet, fleet.Fleet)
  res = sim.run()
  assert len(res.steps) == 4
  for name in ("select_worker", "pending_moves", "running_moves", "tail_moves", "plateau_batch",
               "offload_update", "on_lost", "cut_migrated"):
    assert calls.get(name, 0) > 0, (name, calls)
  assert res.counters["lost"] >= 2 and res.counters["migrated"] > 0


def test_same_seed_same_json_other_seed_other_json():
  cfg, trace = small(max_steps=3), spot_trace(5, 1e6, removes=((55.0, 2),))
  a = json.dumps(simulate(cfg, trace).to_json(), sort_keys=True)
  b = json.dumps(simulate(cfg, trace).to_json(), sort_keys=True)
  c = json.dumps(simulate(small(max_steps=3, seed=1), trace).to_json(), sort_keys=True)
  assert a == b and a != c


def test_every_response_is_trained_on_policy_and_costs_add_up():
  res = simulate(small(max_steps=3), spot_trace(3, 1e6))
  cfg = small()
  n = cfg.workload.prompts_per_step * cfg.workload.group_size
  assert res.counters["completed"] == 3 * n
  assert res.tokens == sum(s.tokens for s in res.steps) and res.wall == res.steps[-1].end
  reserved = cfg.preset.train_nodes * 8 * cfg.prices.on_demand_gpu_hour * res.wall / 3600
  spot = res.spot_instance_hours * 2 * cfg.prices.spot_gpu_hour
  assert res.cost == pytest.approx(reserved + spot)
  assert 0 < res.spot_instance_hours <= 3 * res.wall / 3600 + 1e-9


def test_the_horizon_drops_the_unfinished_step():
  full = simulate(small(max_steps=3))
  cut = simulate(small(max_steps=None, horizon=(full.steps[1].end + full.steps[2].end) / 2))
  assert len(cut.steps) == 2 and cut.wall == full.steps[1].end


def test_a_preset_calibrated_from_our_benchmarks_drives_the_same_simulation():
  from jaxrl_sys.sim import calibrate_from_benchmarks  # pylint: disable=import-outside-toplevel
  from tests.sim.test_lengths_calibrate import benchmark_dicts  # pylint: disable=import-outside-toplevel
  _, generate, grpo, engine = benchmark_dicts()
  preset = calibrate_from_benchmarks(generate, grpo, engine, name="measured")
  cfg = dataclasses.replace(small(max_steps=2), preset=preset)
  assert cfg.local_engines == 1
  res = simulate(cfg, spot_trace(2, 1e6))
  assert len(res.steps) == 2 and res.throughput > 0 and res.preset == "measured"


def test_step_0_runs_at_most_n_resv_instances_and_the_switch_starts_all():
  # Eight spot instances live from t = 0; a Qwen3-8B node runs N_resv = 4 local engines.
  paper = Simulation(small(max_steps=1), spot_trace(8, 1e6))
  res = paper.run()
  assert paper.cfg.local_engines == 4
  assert res.steps[0].remote_live == 4 and len(paper.fleet.workers) == 4
  old = Simulation(with_offload(small(max_steps=1), cap_starts_at_resv=False), spot_trace(8, 1e6))
  res_old = old.run()
  assert res_old.steps[0].remote_live == 8


def test_the_per_minute_series_spans_the_simulated_time_not_an_unreached_horizon():
  # A run stopped by max_steps under a 1e9 s horizon: one point a minute up to where it
  # stopped (it used to fill 16.7M points up to the horizon, minutes of CPU); a run stopped by
  # its horizon keeps one point a minute up to the horizon.
  res = simulate(small(max_steps=2, horizon=1e9), constant_trace(2, 1e9))
  t = res.series["t"]
  assert t[0] == 0.0 and t[-1] <= res.wall + 120.0 and len(t) == len(res.series["used"])
  short = simulate(small(max_steps=None, horizon=300.0), constant_trace(2, 1e9))
  assert short.series["t"][-1] == 300.0 and len(short.series["t"]) == 6


@pytest.mark.parametrize("ceil", [False, True])
def test_no_instance_starts_beyond_the_n_prem_cap(ceil):
  # 24 spot instances are available throughout; the fleet starts one only while it runs
  # fewer than floor(N_prem) (Algorithm 1: none beyond N_prem), ceil(N_prem) with `cap_ceil`.
  sim = Simulation(with_offload(small(max_steps=4), cap_ceil=ceil), spot_trace(24, 1e6))
  seen = []
  sim.manager.add_tick_hook(lambda m, now: seen.append((len(sim.fleet.workers), m.fleet.cap)))
  res = sim.run()
  caps = [s.n_prem_cap for s in res.steps]  # the integer cap each step leaves for the next
  assert all(c >= 1 for c in caps) and min(caps) < 24  # the cap binds here
  grew = [(n, cap) for (n0, _), (n, cap) in zip(seen, seen[1:]) if n > n0]
  assert grew and all(n <= cap for n, cap in grew)


def test_synchronous_push_serves_from_step_0_and_a_late_instance_waits_without_failing():
  # The instances up at the start get version 0 by the push (they sat idle through step 0
  # before); one that starts mid-step waits for the next step's push, however long that step
  # is, and no pull fails: the simulated store is healthy, so the manager's pull deadline (a
  # detector of failing stores) is off in the simulator. It fired inside the full run
  # (`spot_sim --preset=qwen3-14b --settings=sync_push --segments=1`: a WeightLoadError).
  assert driver.SIM_MANAGER.load_timeout == math.inf
  trace = Trace((TraceEvent(0.0, ADD, "n0"), TraceEvent(0.0, ADD, "n1"),
                 TraceEvent(10.0, ADD, "late")), 1e6, "late")
  sim = Simulation(small(max_steps=3, sync_push=True), trace)
  res = sim.run()
  assert res.steps[0].t_remote > 0 and res.steps[0].delta["tokens"] > \
      res.steps[0].delta["tokens_local"]  # the two early instances served step 0
  pulled = [(w, d) for _, kind, w, d in sim.manager.fleet.events if kind == "pulled"
            and w.startswith("spot-late")]
  assert pulled and pulled[0][1].startswith("v1 ") and res.steps[0].end > 10.0
  assert res.counters["pull_failures"] == 0 and len(res.steps) == 3

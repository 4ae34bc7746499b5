"""The offload controller on scripted timings (closed-form expectations), its checkpoint round
trip, and the seeding hand-off over the real manager (a seeded request ends as if undisturbed)."""
import dataclasses
import json
import math

import pytest

from jaxrl_sys.rollout import InProcessWorker, RolloutManager
from jaxrl_sys.rollout.elastic.offload import (OffloadConfig, OffloadDriver, OffloadState,
                                               StepTimings, offload_init, offload_update)
from tests.rollout import common

T = StepTimings(t_wait_train=0.0, t_wait_remote=0.0, t_train=10.0, t_remote=6.0, n_prem=2.0,
                n_next=2, count_changed=False, t_step=30.0)


def test_window_moves_with_the_wait_gap_scaled_by_the_rate():
  cfg = OffloadConfig(t_init=10.0, rate=0.25, memory=False)
  s = offload_init(cfg)
  grown = offload_update(s, dataclasses.replace(T, t_wait_train=8.0, t_wait_remote=2.0), cfg)
  assert grown.t_seed == pytest.approx(10.0 + 0.25 * 6.0)  # trainer starved: longer window
  shrunk = offload_update(s, dataclasses.replace(T, t_wait_train=1.0, t_wait_remote=9.0), cfg)
  assert shrunk.t_seed == pytest.approx(10.0 - 0.25 * 8.0)  # remotes waited: shorter
  same = offload_update(s, dataclasses.replace(T, t_wait_train=3.0, t_wait_remote=3.0), cfg)
  assert same.t_seed == 10.0 and same.steps == 1


def test_window_stays_within_zero_and_the_step():
  cfg = OffloadConfig(t_init=2.0, rate=1.0, memory=False)
  low = offload_update(offload_init(cfg), dataclasses.replace(T, t_wait_remote=50.0), cfg)
  assert low.t_seed == 0.0
  high = offload_update(offload_init(cfg), dataclasses.replace(T, t_wait_train=500.0), cfg)
  assert high.t_seed == T.t_step
  floored = offload_update(offload_init(dataclasses.replace(cfg, t_min=5.0)),
                           dataclasses.replace(T, t_wait_remote=50.0),
                           dataclasses.replace(cfg, t_min=5.0))
  assert floored.t_seed == 5.0


def test_n_prem_is_the_remote_count_that_fits_rollout_in_the_training_time():
  cfg = OffloadConfig(t_init=4.0, rate=0.5, n_resv=2, memory=False)
  s = offload_update(offload_init(cfg), T, cfg)
  # (t_remote * n_prem + T_seed * N_resv) / t_train = (6 * 2 + 4 * 2) / 10
  assert s.n_prem_cap == pytest.approx(2.0) and s.worker_cap() == 2
  s = offload_update(s, dataclasses.replace(T, t_remote=9.0, n_prem=3.0), cfg)
  # 3.5: the fleet runs 3 ("does not allocate beyond N_prem"); the switch rounds up to 4
  assert s.n_prem_cap == pytest.approx((9 * 3 + 4 * 2) / 10) and s.worker_cap() == 3
  assert s.worker_cap(ceil=True) == 4
  tiny = offload_update(s, dataclasses.replace(T, t_remote=0.1, n_prem=1.0), cfg)
  assert tiny.n_prem_cap < 1 and tiny.worker_cap() == tiny.worker_cap(ceil=True) == 1
  off = offload_update(offload_init(cfg), T, dataclasses.replace(cfg, cap_workers=False))
  assert math.isinf(off.n_prem_cap) and off.worker_cap() is None


def test_memory_table_restores_a_count_seen_before():
  cfg = OffloadConfig(t_init=20.0, rate=0.5)
  s = offload_update(offload_init(cfg), dataclasses.replace(T, n_prem=2.0, n_next=2), cfg)
  assert dict(s.memory) == {2: 20.0}
  # two workers, starved trainer: the window grows, stored under 2
  s = offload_update(s, dataclasses.replace(T, t_wait_train=4.0, n_prem=2.0, n_next=2), cfg)
  assert s.t_seed == 22.0 and dict(s.memory)[2] == 22.0
  # the count changes to 3 mid-step: nothing stored; 3 never seen, so the window just moves
  s = offload_update(s, dataclasses.replace(T, t_wait_remote=10.0, n_prem=2.5, n_next=3,
                                            count_changed=True), cfg)
  assert s.t_seed == 17.0 and dict(s.memory) == {2: 22.0}
  s = offload_update(s, dataclasses.replace(T, t_wait_remote=4.0, n_prem=3.0, n_next=3), cfg)
  assert dict(s.memory) == {2: 22.0, 3: 15.0}
  # back to 2 workers: jump to the window remembered for 2 instead of re-converging
  s = offload_update(s, dataclasses.replace(T, n_prem=3.0, n_next=2, count_changed=True), cfg)
  assert s.t_seed == 22.0
  no_mem = dataclasses.replace(cfg, memory=False)
  s2 = offload_update(OffloadState(15.0, memory=((2, 22.0),)),
                      dataclasses.replace(T, n_prem=3.0, n_next=2, count_changed=True), no_mem)
  assert s2.t_seed == 15.0


def test_fixed_windows_and_state_round_trip_through_json():
  cfg = OffloadConfig(fixed=0.0)
  assert offload_update(offload_init(cfg), dataclasses.replace(T, t_wait_train=9.0), cfg).t_seed \
      == 0.0
  s = OffloadState(3.5, 2.25, ((1, 4.0), (3, 2.0)), 7)
  assert OffloadState.from_json(json.loads(json.dumps(s.to_json()))) == s
  inf = OffloadState(1.0)
  assert OffloadState.from_json(json.loads(json.dumps(inf.to_json()))) == inf
  with pytest.raises(ValueError, match="rate"):
    OffloadConfig(rate=0.0)


def test_seeded_requests_end_exactly_as_undisturbed():
  """The trainer's engine generates part of each response, hands off at the window's end, and
  the remote worker finishes them: every response equals `models.generate`'s, and each seeded
  one kept the trainer's tokens (the remote one continued where the trainer stopped)."""
  local = InProcessWorker("trainer", common.CFG, common.engine_config(), local=True)
  remote = InProcessWorker("spot", common.CFG, common.engine_config(), local=False)
  m = RolloutManager([local, remote])
  m.publish(common.params(), 0)
  driver = OffloadDriver(OffloadConfig(t_init=1e9))
  m.add_tick_hook(driver)
  reqs = common.make_requests(6, seed=51, group=2)
  for r in reqs:
    r.max_new_tokens = 12
  m.submit(reqs)
  driver.begin_step(m)
  m.set_accepting("spot", False)  # the spot worker is still starting: the trainer seeds alone
  assert driver.deadline() is not None
  out = []
  while m.fleet.stats.tokens == 0:  # exchange rounds until the trainer's engine generated a chunk
    m.round()
  m.set_accepting("spot", True)
  assert driver.hand_off(m) > 0
  while m.num_pending():
    out += m.poll(min_count=1)
  common.assert_matches(out, common.reference(reqs, common.SAMPLED))
  seeded = [c for c in out if len(m.fleet.provenance(c.request_id)) == 2]
  assert seeded
  for c in seeded:
    (w0, a0, b0), (w1, a1, _) = m.fleet.provenance(c.request_id)
    assert (w0, w1) == ("trainer", "spot") and a0 == 0 and a1 == b0 > 0
  metrics = driver.end_step(m, t_wait_train=0.0, t_train=1.0)
  assert metrics["tokens_local"] + metrics["tokens_remote"] == sum(
      len(c.request.tokens) for c in out) and metrics["tokens_local"] > 0


def test_n_prem_starts_at_n_resv_and_the_switch_restores_no_cap():
  cfg = OffloadConfig(t_init=4.0, n_resv=3)
  assert offload_init(cfg).n_prem_cap == 3.0 and offload_init(cfg).worker_cap() == 3
  old = dataclasses.replace(cfg, cap_starts_at_resv=False)
  assert math.isinf(offload_init(old).n_prem_cap) and offload_init(old).worker_cap() is None
  assert offload_init(dataclasses.replace(cfg, cap_workers=False)).worker_cap() is None
  assert offload_init(OffloadConfig(fixed=0.0, n_resv=3)).worker_cap() is None
  # after the first measured step both follow the same formula
  a, b = offload_update(offload_init(cfg), T, cfg), offload_update(offload_init(old), T, old)
  assert a.n_prem_cap == b.n_prem_cap == pytest.approx((6 * 2 + 4 * 3) / 10)


def _manager_with_six_spot_nodes():
  """A manager on a manual clock whose fleet sees six spot nodes from t = 0."""
  from jaxrl_sys.rollout import ManualClock, MemoryWeightStore  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.elastic.fleet import Fleet  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.elastic.schedules import TracePlayer  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.elastic.traces import constant_trace  # pylint: disable=import-outside-toplevel
  from tests.rollout.fake_worker import FakeWorker  # pylint: disable=import-outside-toplevel
  clock = ManualClock()
  m = RolloutManager(store=MemoryWeightStore(), clock=clock)
  m.add_tick_hook(Fleet(lambda wid: FakeWorker(wid, clock, num_slots=2),
                        schedule=TracePlayer(constant_trace(6, 100.0))))
  return m


@pytest.mark.parametrize("at_resv, started", [(True, 2), (False, 6)])
def test_instances_beyond_the_initial_cap_are_not_started(at_resv, started):
  # Six spot nodes are available from t = 0; the controller (N_resv = 2) caps the fleet before
  # the fleet's first tick, so step 0 runs N_resv of them (Algorithm 1); the switch off starts
  # all six.
  m = _manager_with_six_spot_nodes()
  driver = OffloadDriver(OffloadConfig(t_init=1.0, n_resv=2, cap_starts_at_resv=at_resv))
  driver.apply_cap(m)
  m.round()
  assert len(m.fleet) == started
  driver.begin_step(m)
  m.round()
  assert len(m.fleet) == started


@pytest.mark.parametrize("ceil, started", [(False, 2), (True, 3)])
def test_the_fleet_runs_no_instance_beyond_n_prem(ceil, started):
  # N_prem = 2.6 with six nodes available: Algorithm 1 allocates none beyond N_prem (2); the
  # `cap_ceil` switch rounds up (3).
  m = _manager_with_six_spot_nodes()
  cfg = OffloadConfig(t_init=1.0, n_resv=2, cap_ceil=ceil)
  driver = OffloadDriver(cfg, OffloadState(t_seed=1.0, n_prem_cap=2.6))
  driver.apply_cap(m)
  m.round()
  assert len(m.fleet) == started


def test_a_retirement_is_a_count_change_for_the_memory_table():
  # Algorithm 1 stores M[n] = T_seed only "if the instance count did not change during the
  # step": a worker the fleet retired (the cap fell) changes it as a loss or a join does.
  def step(retire: bool):
    m = _manager_with_six_spot_nodes()
    driver = OffloadDriver(OffloadConfig(t_init=1.0, n_resv=2),
                           OffloadState(t_seed=1.0, n_prem_cap=6.0))
    driver.apply_cap(m)
    m.round()
    driver.begin_step(m)
    if retire:  # the cap falls mid-step: the fleet retires the newest worker after 30 s
      m.set_cap(5)
    for _ in range(40):
      m.clock.advance(1.0)
      m.round()
    driver.end_step(m, t_wait_train=0.0, t_train=1.0)
    return len(m.fleet), dict(driver.state.memory)

  n, memory = step(retire=False)
  assert n == 6 and set(memory) == {6}
  n, memory = step(retire=True)
  assert n == 5 and memory == {}


def test_an_instance_lost_mid_step_does_not_count_as_waiting_to_its_end():
  # t_wait_remote: "time remote instances idle after their last response until the step ends".
  # r1 lives through the step (busy 60 s, last response at 60 s: it waits 40 s); r2 is
  # preempted at 30 s, busy until then: its busy time counts in t_remote, but it did not wait
  # the 70 s to the step's end (it counted as waiting them before, shrinking T_seed).
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout import ManualClock  # pylint: disable=import-outside-toplevel

  class Fleet(dict):  # the read-only view's surface the driver reads
    stats = SimpleNamespace(joined=0, lost=0, tokens=0, tokens_local=0)

  class Manager:  # the elastic port's surface the driver reads
    def __init__(self):
      self.clock, self.cap = ManualClock(), None
      self.fleet = Fleet({w: SimpleNamespace(local=False) for w in ("r1", "r2")})
      self.times, self.remote_s = {"r1": (0.0, 0.0, False), "r2": (0.0, 0.0, False)}, 0.0

    def set_cap(self, n):
      self.cap = n

    def set_accepting(self, worker_id, accepting):
      pass

    def worker_times(self):
      return dict(self.times)

    def remote_worker_seconds(self):
      return self.remote_s

  m = Manager()
  driver = OffloadDriver(OffloadConfig(t_init=10.0, n_resv=1, memory=False))
  driver.begin_step(m)
  m.clock.advance(100.0)
  fake_fleet = m.fleet  # a stand-in of this test's own, not the manager's view
  del fake_fleet["r2"]
  fake_fleet.stats.lost = 1
  m.times, m.remote_s = {"r1": (60.0, 60.0, False), "r2": (30.0, 30.0, False)}, 130.0
  out = driver.end_step(m, t_wait_train=0.0, t_train=50.0)
  assert out["t_remote"] == pytest.approx(45.0) and out["t_wait_remote"] == pytest.approx(40.0)
  assert out["workers_used"] == pytest.approx(1.3)

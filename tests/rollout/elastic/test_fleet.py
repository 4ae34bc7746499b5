"""The fleet follows a spot trace within a cap, over the real manager, on a manual clock."""
import types

import numpy as np

from jaxrl_sys.rollout import ManagerConfig, ManualClock, MemoryWeightStore, RolloutManager
from jaxrl_sys.rollout.elastic.fleet import Fleet
from jaxrl_sys.rollout.elastic.schedules import ChaosSchedule, TracePlayer
from jaxrl_sys.rollout.elastic.traces import Trace, TraceEvent
from tests.rollout.fake_worker import FakeWorker, expected, make_requests


def _setup(schedule, cap, **cfg):
  clock = ManualClock()
  made = {}

  def factory(wid):
    made[wid] = FakeWorker(wid, clock, num_slots=3, tokens_per_exchange=1, latency=0.1)
    return made[wid]

  m = RolloutManager(store=MemoryWeightStore(), config=ManagerConfig(**cfg), clock=clock)
  m.publish({"w": np.zeros(1)}, 0)
  fleet = Fleet(factory, schedule=schedule, cap=cap)
  m.add_tick_hook(fleet)
  return clock, m, fleet, made


def test_fleet_follows_the_trace_within_the_cap_and_nothing_is_lost():
  ev = [TraceEvent(0.0, "add", "a"), TraceEvent(0.0, "add", "b"), TraceEvent(0.0, "add", "c"),
        TraceEvent(1.0, "remove", "a"), TraceEvent(2.0, "remove", "b"),
        TraceEvent(3.0, "add", "d")]
  trace = Trace(tuple(ev), 10.0, "t")
  clock, m, fleet, made = _setup(TracePlayer(trace), cap=2, balance=False)
  reqs = make_requests(30, seed=21, max_new=40)
  m.submit(reqs)
  out, live = [], []
  while m.num_pending():
    out += m.poll(min_count=1, timeout=0.2)
    live.append((clock.now(), len(m.fleet), trace.live_at(clock.now())))
  assert sorted(c.request_id for c in out) == [r.request_id for r in reqs]
  by_id = {r.request_id: r for r in reqs}
  for c in out:
    assert list(c.request.tokens) == expected(by_id[c.request_id])
  for t, n, avail in live:
    assert n <= min(2, avail), (t, n, avail)
  starts = [w for _, a, w in fleet.log if a == "start"]
  assert starts[:2] == ["spot-a.0", "spot-b.0"]  # the cap holds "c" back
  assert "spot-c.0" in starts  # ... until "a" is preempted: spare capacity replaces it at once
  assert [w for _, a, w in fleet.log if a == "preempt"] == ["spot-a.0", "spot-b.0"]
  assert m.fleet.stats.lost == 2 and m.fleet.stats.migrated > 0


def test_lowering_the_cap_retires_workers_gracefully():
  cap = {"n": 3}
  clock = ManualClock()
  made = {}

  def factory(wid):
    made[wid] = FakeWorker(wid, clock, num_slots=3, tokens_per_exchange=1, latency=0.1)
    return made[wid]

  m = RolloutManager(store=MemoryWeightStore(), config=ManagerConfig(balance=False), clock=clock)
  m.publish({"w": np.zeros(1)}, 0)
  fleet = Fleet(factory, size=4, cap=lambda: cap["n"], retire_after=0.5)
  m.add_tick_hook(fleet)
  reqs = make_requests(12, seed=22, max_new=40)
  m.submit(reqs)
  out = m.poll(timeout=1.0)
  assert len(m.fleet) == 3
  cap["n"] = 1
  while m.num_pending():
    out += m.poll(min_count=1, timeout=0.2)
  assert len(m.fleet) == 1 and m.fleet.stats.lost == 0
  by_id = {r.request_id: r for r in reqs}
  for c in out:
    assert list(c.request.tokens) == expected(by_id[c.request_id])
  assert [a for _, a, _ in fleet.log].count("retire") == 2
  stats = m.fleet.stats
  assert stats.balanced > 0 and stats.migrated == 0  # moved with every token, no attempt


def test_chaos_kills_and_restarts_and_every_request_completes():
  clock, m, fleet, made = _setup(ChaosSchedule(kill_every=0.7, seed=3, restart_after=0.5,
                                               slots=3), cap=None, balance=True, theta=1)
  reqs = make_requests(40, seed=23, max_new=30)
  m.submit(reqs)
  out = []
  while m.num_pending():
    out += m.poll(min_count=1, timeout=0.5)
  assert sorted(c.request_id for c in out) == [r.request_id for r in reqs]
  by_id = {r.request_id: r for r in reqs}
  for c in out:
    assert list(c.request.tokens) == expected(by_id[c.request_id])
  assert m.fleet.stats.lost >= 2 and len(made) >= 5
  assert sum(w.generated for w in made.values()) == sum(len(c.request.tokens) for c in out)


class _Port:
  """The elastic port a `Fleet` drives (`fleet` view, `add_worker`, `retire_worker`), without a
  manager: workers join it and stay (nothing runs them), and the test sets what every one of
  them does (`serving`: None starting, False idle with weights, True generating)."""

  cap = None

  def __init__(self):
    self.ids: list[str] = []
    self.serving: bool | None = None

  @property
  def fleet(self):
    return self

  def __contains__(self, worker_id):
    return worker_id in self.ids

  def get(self, worker_id):
    if worker_id not in self.ids:
      return None
    return types.SimpleNamespace(version=-1 if self.serving is None else 0,
                                 assigned=(0,) if self.serving else ())

  def add_worker(self, worker):
    self.ids.append(worker.worker_id)

  def retire_worker(self, worker_id):
    self.ids.remove(worker_id)


def test_chaos_clock_counts_serving_time_only():
  """`serving_clock`: no kill lands while every fleet worker is starting (no weights, no
  requests); once one serves, kills follow the schedule's gaps in serving time, and the clock
  stands still again while none holds work. The plain clock kills a starting fleet on the
  same schedule."""
  def run(serving_clock):
    clock, m = ManualClock(), _Port()
    fleet = Fleet(lambda wid: FakeWorker(wid, clock, num_slots=2), serving_clock=serving_clock,
                  schedule=ChaosSchedule(kill_every=1.0, seed=5, restart_after=0.2, slots=2,
                                         distribution="uniform"))
    t, kills = 0.0, []

    def ticks(n, serving):
      nonlocal t
      for _ in range(n):
        m.serving = serving  # every worker (restarted ones too) serves or starts
        fleet(m, t)
        t += 0.1
        kills.append(sum(a == "preempt" for _, a, _ in fleet.log))

    ticks(40, serving=None)   # 4 s: every worker starting
    ticks(40, serving=True)   # 4 s serving
    ticks(40, serving=False)  # 4 s: weights in, nothing to generate
    return kills

  kills = run(serving_clock=True)
  assert kills[39] == 0, "a kill landed before any worker served"
  assert kills[79] >= 2  # 4 s of serving time, gaps of 0.5-1.5 s
  assert kills[119] - kills[80] <= 1  # the pause: at most the kill due at its first tick

  # Every worker killed: the clock runs while none is alive, so the slots restart.
  clock, m = ManualClock(), _Port()
  m.serving = True
  fleet = Fleet(lambda wid: FakeWorker(wid, clock, num_slots=2), serving_clock=True,
                schedule=ChaosSchedule(kill_every=1.0, seed=5, restart_after=0.5, slots=1))
  for i in range(30):
    fleet(m, i * 0.1)
  starts = [w for _, a, w in fleet.log if a == "start"]
  assert len(starts) >= 2, fleet.log
  assert run(serving_clock=False)[39] >= 2, "the plain clock kills starting workers"


def test_kills_pause_while_no_worker_has_finished_starting():
  """Issue 44: kills faster than a worker starts (2 s here, a kill every 0.3 s of serving)
  livelocked a run. With `pause_kills` a kill only lands after a worker finished starting
  since the previous one; every kill, join and migration is one line; nothing is lost."""
  clock, made, said = ManualClock(), {}, []

  def factory(wid):
    made[wid] = FakeWorker(wid, clock, num_slots=3, tokens_per_exchange=1, latency=0.1,
                           load_delay=2.0)
    return made[wid]

  m = RolloutManager(store=MemoryWeightStore(), config=ManagerConfig(balance=False), clock=clock)
  m.publish({"w": np.zeros(1)}, 0)
  fleet = Fleet(factory, schedule=ChaosSchedule(kill_every=0.3, seed=3, restart_after=0.1,
                                                slots=2, distribution="uniform"),
                serving_clock=True, pause_kills=True, message=said.append)
  m.add_tick_hook(fleet)
  reqs = make_requests(20, seed=24, max_new=40)
  m.submit(reqs)
  out = []
  while m.num_pending() and clock.now() < 600:
    out += m.poll(min_count=1, timeout=0.2)
  by_id = {r.request_id: r for r in reqs}
  assert sorted(c.request_id for c in out) == sorted(by_id)
  for c in out:
    assert list(c.request.tokens) == expected(by_id[c.request_id])
  kinds = [a for _, a, _ in fleet.log if a in ("preempt", "join")]
  kills = kinds.count("preempt")
  assert kills >= 2 and fleet.skipped_kills > 0
  for i, a in enumerate(kinds[:-1]):  # a join between any two kills
    assert not (a == "preempt" and kinds[i + 1] == "preempt"), fleet.log
  assert sum(s.startswith("fleet: killed ") for s in said) == kills
  assert sum(s.startswith("fleet: kills paused") for s in said) >= 1
  assert sum(s.endswith("joined (serving weight version 0)") for s in said) == kinds.count("join")
  assert any(s.startswith("fleet: migrated ") for s in said) and m.fleet.stats.migrated > 0

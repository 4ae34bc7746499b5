"""The rollout manager over scripted workers on a manual clock: completeness, migration,
heartbeats, late chunks, retries, version gating, joins, Θ, load balancing, checkpoints.

The reference for every response is `fake_worker.expected`: tokens are a pure function of the
request key and index, as the real engine's are, so a response must come out the same however
it was routed, moved or migrated.
"""
import numpy as np
import pytest

from jaxrl_sys.rollout import (ManagerConfig, ManualClock, MemoryWeightStore, RequestFailedError,
                               RolloutManager)
from tests.rollout.fake_worker import FakeWorker, expected, make_requests

PARAMS = {"w": np.zeros((1,), np.float32)}


def manager(workers, clock, **kw):
  m = RolloutManager(workers, store=MemoryWeightStore(), config=ManagerConfig(**kw), clock=clock)
  m.publish(PARAMS, 0)
  return m


def drain(m, limit=100_000):
  out = []
  for _ in range(limit):
    if not m.num_pending():
      return out
    out += m.poll(min_count=1)
  raise AssertionError("did not finish")


def check_complete(out, reqs):
  ids = [c.request_id for c in out]
  assert sorted(ids) == sorted(r.request_id for r in reqs), "lost or duplicated requests"
  by_id = {r.request_id: r for r in reqs}
  for c in out:
    r = by_id[c.request_id]
    assert list(c.request.tokens) == expected(r), c.request_id
    assert len(c.request.versions) == len(c.request.tokens) == len(c.request.logprobs)


def test_every_request_completes_exactly_once_and_theta_holds():
  clock = ManualClock()
  ws = [FakeWorker(f"w{i}", clock, num_slots=3, latency=0.05 * (i + 1)) for i in range(3)]
  m = manager(ws, clock, theta=2)
  reqs = make_requests(40, seed=1)
  m.submit(reqs)
  out = drain(m)
  check_complete(out, reqs)
  assert all(w.max_waiting <= 2 for w in ws), [w.max_waiting for w in ws]
  assert all(w.generated for w in ws)
  # Time only moved through the injected clock: virtual seconds, not the wall clock.
  assert 0 < clock.now() < 60 and all(t <= clock.now() for t, *_ in m.fleet.events)


def test_worker_death_migrates_with_every_token_kept():
  clock = ManualClock()
  dying = FakeWorker("dying", clock, num_slots=4, latency=0.1, die_at=0.45)
  ws = [dying, FakeWorker("b", clock, num_slots=4, latency=0.1)]
  m = manager(ws, clock, theta=0, balance=False)
  reqs = make_requests(8, seed=2, max_new=20)
  m.submit(reqs)
  out = drain(m)
  check_complete(out, reqs)
  moved = [c for c in out if m.fleet.provenance(c.request_id)[0][0] == "dying"
           and len(m.fleet.provenance(c.request_id)) > 1]
  assert moved, "the dying worker held unfinished requests"
  kept = 0
  for c in moved:
    prov = m.fleet.provenance(c.request_id)
    assert prov[1][1] == prov[0][2], prov  # the next worker starts where the dead one stopped
    kept += prov[0][2] - prov[0][1]
  stats = m.fleet.stats
  assert stats.lost == 1 and stats.migrated >= len(moved) and stats.tokens_kept == kept
  # No token was generated twice: the workers together produced exactly the final tokens.
  assert sum(w.generated for w in ws) == sum(len(c.request.tokens) for c in out)


def test_hung_worker_is_lost_after_the_heartbeat_timeout():
  clock = ManualClock()
  hung = FakeWorker("hung", clock, num_slots=4, latency=0.1, hang_at=0.3)
  m = manager([hung, FakeWorker("b", clock, num_slots=4)], clock, heartbeat_timeout=2.0,
              balance=False)
  reqs = make_requests(8, seed=3, max_new=30)
  m.submit(reqs)
  out = drain(m)
  check_complete(out, reqs)
  lost = [e for e in m.fleet.events if e[1] == "lost"]
  assert len(lost) == 1 and lost[0][2] == "hung" and "no report within 2 s" in lost[0][3]
  assert 2.0 < lost[0][0] < 2.6 and hung.dead  # killed, no zombie


def test_late_and_duplicated_chunks_are_ignored():
  clock = ManualClock()
  a, b = FakeWorker("a", clock, latency=0.1), FakeWorker("b", clock, latency=0.1)
  m = manager([a, b], clock, balance=False)
  reqs = make_requests(6, seed=4, max_new=20)
  m.submit(reqs)
  m.poll(timeout=0.35)
  rid = next(iter(m.fleet["a"].assigned))
  a.pending = None
  from jaxrl_sys.rollout import Commands  # pylint: disable=import-outside-toplevel
  a.send(Commands())
  clock.advance(0.1)
  rep = a.receive()  # one more report from "a"
  m.remove_worker("a", "test")
  before = m.fleet.stats.ignored_reports
  m.core.on_report(rep, clock.now())  # a late report of a lost worker
  assert m.fleet.stats.ignored_reports == before + 1
  for _ in range(1000):  # the migrated request reaches "b", whose exchange is over
    if rid in m.fleet["b"].assigned and not m.fleet["b"].outstanding:
      break
    clock.advance(0.01)
    m.round()
  tokens = lambda: {r.request_id: r for r in m.snapshot()}[rid].num_generated  # noqa: E731
  n = tokens()
  dup = [c for c in rep.chunks if c.request_id == rid]
  for c in dup:  # "b" owns it now and sends a chunk that does not start at the tokens so far
    c.start = max(n - 1, 0)
    m.core.on_report(type(rep)("b", 1, [c], 0, -1, [], [], 4, np.zeros((0, 3))), clock.now())
  assert tokens() == n  # a duplicate never extends a response
  check_complete(drain(m), reqs)


def _replacing(clock, **worker_kw):
  """A tick hook that adds a fresh worker whenever none is left (as a fleet would)."""
  counter = {"n": 0}

  def replace(mgr, now):
    if not len(mgr.fleet):
      counter["n"] += 1
      kw = {k: now + v for k, v in worker_kw.items()}  # lifetimes from the join
      mgr.add_worker(FakeWorker(f"d{counter['n']}", clock, latency=0.1, **kw))

  return replace, counter


def test_preemptions_do_not_count_against_a_request():
  # Every worker is preempted 0.25 s after it joins (WorkerLost). The request goes through
  # more losses than its failure budget and still completes with the undisturbed tokens.
  clock = ManualClock()
  replace, counter = _replacing(clock, die_at=0.25)
  m = manager([], clock, max_attempts=2)
  m.add_tick_hook(replace)
  reqs = make_requests(1, seed=5, max_new=40)
  m.submit(reqs)
  check_complete(drain(m), reqs)
  assert m.fleet.stats.lost >= 3 and counter["n"] >= 4 and m.fleet.stats.migrated >= 3


def test_worker_errors_count_against_the_request_and_name_it():
  # Every worker breaks with an error 0.25 s after it joins, while holding the request: those
  # count, and the third failure over max_attempts=2 ends the request.
  clock = ManualClock()
  replace, _ = _replacing(clock, fail_at=0.25)
  m = manager([], clock, max_attempts=2)
  m.add_tick_hook(replace)
  m.submit(make_requests(1, seed=5, max_new=40))
  with pytest.raises(RequestFailedError, match=r"request 0 failed: the workers serving it failed "
                     r"3 times \(last: d3: worker failed: RuntimeError: scripted engine failure"):
    drain(m)


def test_on_policy_requests_never_see_an_older_version():
  clock = ManualClock()
  ws = [FakeWorker("fast", clock, load_delay=0.0), FakeWorker("slow", clock, load_delay=1.5)]
  m = manager(ws, clock, balance=False)
  old = make_requests(8, seed=6, max_new=6)
  m.submit(old)
  drain(m)
  m.publish(PARAMS, 1)
  new = make_requests(24, seed=7, max_new=40, min_version=1, first_id=100)
  m.submit(new)
  out = drain(m)
  check_complete(out, new)
  for c in out:
    assert (c.request.versions == 1).all(), (c.request_id, c.request.versions)
  served = [v for w in ws for rid, _, v in w.versions_served if rid >= 100]
  assert served and min(served) == 1
  assert any(rid >= 100 for rid, _, _ in ws[1].versions_served)  # the slow one joined in


def test_worker_joining_mid_step_pulls_the_current_version_and_gets_work():
  clock = ManualClock()
  m = manager([FakeWorker("a", clock, num_slots=2, tokens_per_exchange=1)], clock, theta=0)
  m.publish(PARAMS, 3)
  reqs = make_requests(10, seed=8, max_new=30, min_version=3)
  m.submit(reqs)
  out = m.poll(timeout=1.0)
  joiner = FakeWorker("joiner", clock, num_slots=4, tokens_per_exchange=1)
  m.add_worker(joiner)
  out += drain(m)
  check_complete(out, reqs)
  assert joiner.version == 3 and joiner.generated > 0
  assert [e for e in m.fleet.events if e[1] == "ready" and e[2] == "joiner"][0][3] == "3"


def test_balancer_moves_exactly_running_minus_plateau():
  clock = ManualClock()
  busy = FakeWorker("busy", clock, num_slots=10, tokens_per_exchange=1)
  m = manager([busy], clock, theta=0, plateau_batch=3)
  reqs = make_requests(10, seed=9, max_new=40)
  for r in reqs:
    r.max_new_tokens = 40
  reqs = [r for r in reqs if len(expected(r)) > 20]
  m.submit(reqs)
  out = m.poll(timeout=0.5)
  assert not out and len(m.fleet["busy"].running) == len(reqs)
  m.add_worker(FakeWorker("idle", clock, num_slots=10, tokens_per_exchange=1))
  out = drain(m)
  check_complete(out, reqs)
  moves = [e for e in m.fleet.events if e[1] == "move"]
  assert moves[0][2:] == ("busy", f"{len(reqs) - 3} running to idle"), moves


def test_abort_returns_exact_partial_state_and_resubmission_finishes_it():
  clock = ManualClock()
  m = manager([FakeWorker("a", clock), FakeWorker("b", clock)], clock)
  reqs = make_requests(8, seed=10, max_new=30)
  m.submit(reqs)
  first = m.poll(timeout=0.3)
  partial = m.abort()
  assert m.num_pending() == len(first) or not first
  done_ids = {c.request_id for c in first} | {c.request_id for c in m.poll(timeout=0)}
  assert {r.request_id for r in partial} | done_ids == {r.request_id for r in reqs}
  for r in partial:
    assert list(r.tokens) == expected(r)[:r.num_generated]
  m.submit(partial)
  rest = drain(m)
  check_complete(rest, partial)


def test_snapshot_resumes_exactly_on_fresh_workers():
  clock = ManualClock()
  m = manager([FakeWorker("a", clock), FakeWorker("b", clock)], clock)
  reqs = make_requests(10, seed=11, max_new=30)
  m.submit(reqs)
  done = m.poll(timeout=0.4)
  snap = m.snapshot()
  assert any(r.num_generated for r in snap)
  clock2 = ManualClock()
  m2 = manager([FakeWorker("c", clock2)], clock2)
  m2.submit(snap)
  check_complete(done + drain(m2), reqs)


def test_a_failed_weight_publish_is_an_error_not_a_stall(tmp_path):
  from jaxrl_sys.rollout.weights.tensorstore import TensorstoreWeightStore  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.weights.base import WeightPublishError  # pylint: disable=import-outside-toplevel
  root = tmp_path / "store"
  store = TensorstoreWeightStore(str(root))
  if root.exists():
    root.rmdir()
  root.write_text("a file where the store's directory should be: every write fails")
  clock = ManualClock()
  m = RolloutManager([FakeWorker("a", clock)], store=store, clock=clock)
  m.publish(PARAMS, 0)
  m.submit(make_requests(2, seed=12))
  with pytest.raises(WeightPublishError, match="version 0"):
    for _ in range(1000):
      m.poll(timeout=0.1)


@pytest.mark.parametrize("ablation", ["restart_from_prompt", "trim_siblings"])
def test_migration_ablations_stay_correct_but_redo_decode_work(ablation):
  clock = ManualClock()
  # Two slots and Θ = 4 on the first worker, alone at dispatch: it holds a group's siblings at
  # different progress (two running, two waiting) when it dies; "b" joins later.
  dying = FakeWorker("dying", clock, num_slots=2, latency=0.1, die_at=0.45)
  ws = [dying, FakeWorker("b", clock, num_slots=2, latency=0.1)]
  kw = {"migrate_tokens": False} if ablation == "restart_from_prompt" else {"trim_siblings": True}
  m = manager(ws[:1], clock, theta=4, balance=False, **kw)
  m.add_tick_hook(lambda mgr, now: now > 0.2 and "b" not in mgr.fleet and mgr.add_worker(ws[1]))
  reqs = make_requests(8, seed=2, max_new=20)
  for i, r in enumerate(reqs):
    r.group_id = i // 4  # two groups of four siblings
  m.submit(reqs)
  out = drain(m)
  check_complete(out, reqs)  # the same responses: randomness is per request and index
  assert m.fleet.stats.tokens_discarded > 0
  redone = sum(w.generated for w in ws) - sum(len(c.request.tokens) for c in out)
  assert redone == m.fleet.stats.tokens_discarded  # every discarded token was generated again
  if ablation == "restart_from_prompt":
    assert m.fleet.stats.tokens_kept == 0


class _SyncWorker(FakeWorker):
  """Answers inside `receive()` (like `InProcessWorker`): no latency, nothing to wait for."""
  synchronous = True


def test_a_synchronous_worker_is_never_waited_for():
  # Each new version queues a pull in the tick after the workers' turn; the next round must
  # send it at once, not after poll_interval (virtual seconds on the manual clock).
  clock = ManualClock()
  m = manager([_SyncWorker("local", clock, num_slots=8, latency=0.0)], clock, poll_interval=5.0)
  for version in (1, 2, 3):
    m.publish(PARAMS, version)
    reqs = make_requests(6, seed=version, min_version=version, first_id=100 * version)
    m.submit(reqs)
    check_complete(drain(m), reqs)
  assert clock.now() == 0.0


def test_a_request_submitted_while_a_synchronous_worker_decodes_joins_its_next_exchange():
  # An episode's next turn arrives while other requests decode: the very next round's exchange
  # (an in-process engine step, run inside `receive`) serves it, not the one after the tick.
  clock = ManualClock()
  w = _SyncWorker("local", clock, num_slots=16, latency=0.0)
  m = manager([w], clock)
  first = make_requests(8, seed=3, max_new=40)
  m.submit(first)
  while not w.generated:  # the weights load, then the requests decode
    m.round()
  assert m.fleet["local"].assigned  # still decoding
  late = make_requests(2, seed=4, first_id=50)
  m.submit(late)
  m.round()
  served = {rid for rid, index, _ in w.versions_served if index == 0}
  assert {50, 51} <= served
  check_complete(drain(m), first + late)


@pytest.mark.parametrize("sticky", [True, False])
def test_a_sessions_next_request_goes_to_the_worker_that_served_its_last(sticky):
  """Sticky sessions: each session's second request returns to the worker that finished its
  first, against the join-shortest-queue order (submitted in reverse); once that worker is
  gone, elsewhere. Without stickiness, plain join-shortest-queue."""
  clock = ManualClock()
  ws = [FakeWorker(f"w{i}", clock, num_slots=4, latency=0.1) for i in range(2)]
  m = manager(ws, clock, sticky_sessions=sticky, balance=False)

  def turn(first_id, sessions):
    reqs = make_requests(len(sessions), seed=first_id, first_id=first_id)
    for r, s in zip(reqs, sessions):
      r.meta["session"] = s
    m.submit(reqs)
    out = drain(m)
    check_complete(out, reqs)
    return {r.meta["session"]: m.fleet.provenance(r.request_id)[0][0] for r in reqs}

  first = turn(0, ["a", "b", "c", "d"])
  assert set(first.values()) == {"w0", "w1"}
  second = turn(10, ["d", "c", "b", "a"])
  if sticky:
    assert second == first
  else:
    assert second != first
  m.remove_worker(first["a"])
  third = turn(20, ["a"])
  assert third["a"] != first["a"]

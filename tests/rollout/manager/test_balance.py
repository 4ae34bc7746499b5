"""The routing and balancing policies as pure functions, against hand-worked cases."""
import numpy as np

from jaxrl_sys.rollout.manager.balance import (WorkerLoad, pending_moves, plateau_batch,
                                               running_moves, select_worker, tail_moves)


def load(wid, version=0, running=0, pending=0, slots=4, accepting=True, plateau=None):
  return WorkerLoad(wid, version, running, pending, slots, accepting, plateau)


def test_join_shortest_queue_with_delayed_dispatch_and_version_gating():
  ws = [load("a", running=4, pending=1), load("b", running=1, pending=0), load("c", version=-1)]
  assert select_worker(ws, min_version=0, theta=2) == "b"  # fewest pending
  ws = [load("a", running=2, pending=0), load("b", running=1, pending=0)]
  assert select_worker(ws, 0, 2) == "b"  # tie on pending: fewest running
  assert select_worker([load("a", running=4, pending=2)], 0, theta=2) is None  # Θ reached: wait
  assert select_worker([load("a", running=4, pending=1)], 0, theta=2) == "a"
  assert select_worker([load("a", version=2), load("b", version=3)], 3, 2) == "b"  # gating
  assert select_worker([load("a", version=2)], 3, 2) is None
  assert select_worker([load("a"), load("b", accepting=False)], 0, 2, target="b") == "a"
  assert select_worker([load("a"), load("b", pending=1)], 0, 2, target="b") == "b"


def test_running_moves_take_exactly_running_minus_plateau():
  for running, b, expect in [(10, 3, 7), (5, 5, None), (4, 6, None), (12, 0, 12)]:
    ws = [load("busy", running=running, slots=16, plateau=b), load("idle", slots=16)]
    got = running_moves(ws, theta=0)
    assert got == (None if expect is None else ("busy", "idle", expect)), (running, b, got)
  # capped by what the receiver can hold; the busiest excess donates; unknown B never donates
  ws = [load("a", running=10, slots=10, plateau=2), load("idle", slots=3)]
  assert running_moves(ws, theta=1) == ("a", "idle", 4)
  ws = [load("a", running=6, slots=8, plateau=2), load("b", running=9, slots=10, plateau=8),
        load("c", running=9, slots=10), load("idle")]
  assert running_moves(ws, theta=0) == ("a", "idle", 4)
  assert running_moves([load("a", running=3, plateau=1), load("b", running=1)], 0) is None


def test_tail_moves_halve_the_busiest_worker_for_an_idle_one():
  # below the plateau RLBoost's rule moves nothing; the tail rule halves the busiest worker
  ws = [load("a", running=5, slots=16, plateau=8), load("b", running=9, slots=16, plateau=12),
        load("idle", slots=16, plateau=8)]
  assert running_moves(ws, theta=0) is None
  assert tail_moves(ws, theta=0) == ("b", "idle", 4)
  assert tail_moves([load("a", running=9, slots=16), load("idle", slots=2)], 0) == ("a", "idle", 2)
  # nothing to gain: one running request, no idle worker, a donor with work waiting, an idle
  # worker that is behind the donor's version or not accepting
  assert tail_moves([load("a", running=1), load("idle")], 0) is None
  assert tail_moves([load("a", running=4), load("b", running=1)], 0) is None
  assert tail_moves([load("a", running=4, pending=1), load("idle")], 0) is None
  assert tail_moves([load("a", version=2, running=4), load("idle", version=1)], 0) is None
  assert tail_moves([load("a", running=4), load("idle", accepting=False)], 0) is None


def test_pending_moves_only_take_requests_stuck_for_want_of_a_slot():
  # "a" is full with 5 waiting; starved "b" has 3 free slots and takes 3
  ws = [load("a", running=4, pending=5, slots=4), load("b", running=1, pending=0, slots=4)]
  assert pending_moves(ws) == [("a", "b", 3)]
  # pending at a worker with free slots is about to run there: nothing moves (no ping-pong)
  ws = [load("a", running=0, pending=1, slots=4), load("b", slots=4)]
  assert pending_moves(ws) == []
  # two starved receivers share the stuck requests
  ws = [load("a", running=2, pending=4, slots=2), load("b", slots=2), load("c", slots=2)]
  assert pending_moves(ws) == [("a", "b", 2), ("a", "c", 2)]


def test_plateau_batch_finds_the_knee_of_a_measured_profile():
  # Step time a + b * batch: throughput batch / (a + b * batch) saturates at 1 / b.
  a, b = 10e-3, 1e-3
  rows = [(n, 8 * n, 8 * (a + b * n)) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
  thr = {n: n / (a + b * n) for n, *_ in rows}
  want = min(n for n in thr if thr[n] >= 0.9 * max(thr.values()))
  assert plateau_batch(np.array(rows), frac=0.9) == want == 128
  assert plateau_batch(np.array(rows[:1])) is None  # one batch size: nothing to compare
  assert plateau_batch(np.zeros((0, 3))) is None

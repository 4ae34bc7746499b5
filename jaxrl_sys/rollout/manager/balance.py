"""Routing and load-balancing policies of the rollout manager, as small pure functions.

Each takes the manager's view of its workers (`WorkerLoad`, plain data) and returns a decision;
the manager applies it. RLBoost's Algorithm 2, with the parts its released code leaves out:

- `select_worker`: join-shortest-queue on *pending* requests (assigned to a worker, not yet in
  one of its decode slots) with delayed dispatch: a worker takes requests while its pending
  count is below its free slots plus Θ; when every eligible worker is full the request waits.
  Version gating: a request with `min_version = v` only goes to a worker serving version >= v.
- `pending_moves` (continuous balancing, branch a): a starved worker (nothing pending, free
  slots) takes requests that wait for a slot at the worker with the most of them.
- `running_moves` (branch b): a fully idle worker takes `max(running - B, 0)` *running* requests
  from the busiest worker, B being the batch size at which that worker's decode throughput
  plateaus (`plateau_batch`, measured online from the profile each worker reports).
- `tail_moves` (branch c, ours): in the tail of a batch (nothing queued, every worker at or
  below its plateau), a fully idle worker takes half of the running requests of the busiest
  worker. Below B the donor's aggregate throughput no longer grows with its batch, but each
  request's own decode speed still falls with it: splitting the last long responses over idle
  workers shortens the step (RLBoost's rule `max(running - B, 0)` leaves them where they are).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class WorkerLoad:
  """The manager's view of one worker.

  Attributes:
    worker_id: the worker.
    version: weight version it serves (-1: no weights yet).
    running: requests in its decode slots.
    pending: requests assigned to it and not yet running (queued there or on the way).
    num_slots: its decode slots.
    accepting: alive, weights loaded, not retiring or disabled.
    plateau: B, the batch where its decode throughput plateaus (None: not measured yet).
  """
  worker_id: str
  version: int
  running: int
  pending: int
  num_slots: int
  accepting: bool = True
  plateau: int | None = None

  def room(self, theta: int) -> int:
    """How many more requests it may take now: free slots + Θ - pending."""
    return max(self.num_slots - self.running, 0) + theta - self.pending


def select_worker(loads: Sequence[WorkerLoad], min_version: int, theta: int,
                  target: str | None = None) -> str | None:
  """The worker for one request, or None to keep it waiting (delayed dispatch).

  Candidates accept work, serve version >= `min_version` and have room; among them the fewest
  pending wins, then the fewest running, then the earliest in `loads` (join order). A request
  moved by the balancer names its `target`, and a session's next request the worker that
  served its previous one (sticky sessions); it takes that worker while the worker qualifies.
  """
  ok = [w for w in loads if w.accepting and w.version >= max(min_version, 0) and w.room(theta) > 0]
  if not ok:
    return None
  if target is not None:
    for w in ok:
      if w.worker_id == target:
        return target
  best = min(range(len(ok)), key=lambda i: (ok[i].pending, ok[i].running, i))
  return ok[best].worker_id


def pending_moves(loads: Sequence[WorkerLoad]) -> list[tuple[str, str, int]]:
  """Branch (a): a starved worker (accepting, nothing pending, free slots) takes requests that
  wait at the worker with the most of them for want of a free slot, at most as many as it has
  free slots. Requests pending at a worker with free slots are about to start there and never
  move (moving them would only bounce them between workers). Returns `(donor, receiver,
  count)` moves."""
  stuck = {w.worker_id: max(w.pending - max(w.num_slots - w.running, 0), 0) for w in loads}
  moves = []
  for w in loads:
    free = w.num_slots - w.running
    if not (w.accepting and w.pending == 0 and free > 0):
      continue
    donors = [d for d in loads if d.worker_id != w.worker_id and stuck[d.worker_id] > 0
              and d.version <= w.version]
    if not donors:
      continue
    d = max(donors, key=lambda x: stuck[x.worker_id])
    n = min(stuck[d.worker_id], free)
    moves.append((d.worker_id, w.worker_id, n))
    stuck[d.worker_id] -= n
  return moves


def running_moves(loads: Sequence[WorkerLoad], theta: int) -> tuple[str, str, int] | None:
  """Branch (b): if some accepting worker is fully idle, it takes `max(running_j - B_j, 0)`
  running requests from the busiest worker j (whose plateau B_j is known), at most what the
  receiver has room for. Returns `(donor, receiver, count)` or None."""
  def excess(d):
    return d.running - d.plateau if d.plateau is not None else 0

  return _take_running(loads, theta, excess, lambda d: (excess(d), d.running))


def tail_moves(loads: Sequence[WorkerLoad], theta: int) -> tuple[str, str, int] | None:
  """Branch (c): if some accepting worker is fully idle, it takes `running_j // 2` running
  requests from the worker j with the most running (at least 2), at most what the receiver
  has room for. The manager calls it only when nothing is queued and `running_moves` found
  nothing. Returns `(donor, receiver, count)` or None."""
  return _take_running(loads, theta, lambda d: d.running // 2 if d.pending == 0 else 0,
                       lambda d: d.running)


def _take_running(loads: Sequence[WorkerLoad], theta: int, give,
                  rank) -> tuple[str, str, int] | None:
  """The first fully idle accepting worker takes `give(j)` running requests (at most its room)
  from the donor j with the highest `rank(j)` among those with `give(j) > 0` and a version no
  newer than the receiver's. Returns `(donor, receiver, count)` or None."""
  idle = [w for w in loads if w.accepting and w.running == 0 and w.pending == 0]
  if not idle:
    return None
  receiver = idle[0]
  donors = [d for d in loads if d.worker_id != receiver.worker_id and give(d) > 0
            and d.version <= receiver.version]
  if not donors:
    return None
  d = max(donors, key=rank)
  n = min(give(d), receiver.room(theta))
  return (d.worker_id, receiver.worker_id, n) if n > 0 else None


def settle(loads: Sequence[WorkerLoad],
           moves: Sequence[tuple[str, str, bool]]) -> list[WorkerLoad]:
  """The routing view with the balancer's moves in flight settled: a request being moved counts
  at its target (pending), no longer at its donor. The balancer runs at every tick, long before
  a donor acknowledges an abort; without this it would move again what is on its way.

  Args:
    loads: the workers' loads as they report them.
    moves: `(donor, target, running at the donor)` of each request on its way.
  """
  if not moves:
    return list(loads)
  gone = collections.Counter(d for d, _, running in moves if not running)
  gone_running = collections.Counter(d for d, _, running in moves if running)
  coming = collections.Counter(t for _, t, _ in moves)
  return [dataclasses.replace(w, running=w.running - gone_running[w.worker_id],
                              pending=w.pending - gone[w.worker_id] + coming[w.worker_id])
          for w in loads]


def plateau_batch(profile: np.ndarray, frac: float = 0.9, min_tokens: int = 1) -> int | None:
  """B: the smallest batch whose decode throughput reaches `frac` of the best seen.

  Args:
    profile: `[n, 3]` rows `(live requests, tokens produced, seconds)` of decode calls.
    frac: how close to the best throughput counts as the plateau.
    min_tokens: batch sizes with fewer tokens in total are ignored (noise).

  Returns:
    B, or None while fewer than two batch sizes were seen (nothing to compare).
  """
  profile = np.asarray(profile, np.float64).reshape(-1, 3)
  if len(profile) == 0:
    return None
  batch = profile[:, 0].astype(np.int64)
  live = batch > 0
  # Per batch size: total tokens and seconds (one vectorised pass; this runs at every tick).
  sizes, inv = np.unique(batch[live], return_inverse=True)
  toks = np.bincount(inv, weights=profile[live, 1], minlength=len(sizes))
  secs = np.bincount(inv, weights=profile[live, 2], minlength=len(sizes))
  ok = (toks >= min_tokens) & (secs > 0)
  if int(ok.sum()) < 2:
    return None
  thr = toks[ok] / secs[ok]
  return int(sizes[ok][thr >= frac * thr.max()].min())

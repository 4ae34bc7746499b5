"""The rollout manager's state machine: events in, commands and effects out, no I/O.

Events (each with its clock time): `submit`, `publish`, `on_committed` (the store committed a
version), `add_worker`, `on_sent`, `on_report` (chunks, loads, rejections of one exchange),
`on_lost`, `retire_worker`, `evacuate`, `set_accepting`, `set_cap`, `begin_tick` / `tick`
(heartbeats, weight loads, dispatch, balancing), the aborts. Out: `outbox()` (each worker's
`Commands` when its exchange is due) and `take_effects()` (`state.Kill`, `state.Release`,
`state.Publish`, `state.CollectGarbage`: the exchange loop carries them out).

Two tables, one state machine between them: `requests.RequestTable` (token state, queue,
completions, migration cuts) and `fleet.WorkerTable` (joins, losses, weight loads, garbage
collection, the cap, busy accounting); the core decides which worker holds which request
(dispatch with version gating, migration, evacuation, load balancing). Every field is private;
`fleet` is the read-only view. Every decision depends only on the events and their times, so
the simulator drives the same code on a virtual clock.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable, Iterator, Sequence

from jaxrl_sys.rollout.manager import balance
from jaxrl_sys.rollout.manager.config import ManagerConfig, RequestFailedError
from jaxrl_sys.rollout.manager.fleet import WorkerTable
from jaxrl_sys.rollout.manager.requests import RequestTable
from jaxrl_sys.rollout.manager.state import Effect, Ledger, Publish, ReqState
from jaxrl_sys.rollout.manager.view import FleetView, TableView
from jaxrl_sys.rollout.types import Completion, Request
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerReport


class ManagerCore:
  """The event-driven state machine a `RolloutManager` drives (see the module docstring).

  Args:
    config: `ManagerConfig`.
    now: the clock time it starts at.
    store_name: the weight store's kind and location, for error messages.
  """

  __slots__ = ("_config", "_ledger", "_table", "_view", "_reqs", "_moves", "_last_progress")

  def __init__(self, config: ManagerConfig = ManagerConfig(), *, now: float = 0.0,
               store_name: str = "the weight store"):
    self._config = config
    self._ledger = Ledger()
    self._table = WorkerTable(config, self._ledger, now, store_name)
    self._view = TableView(self._table, self._ledger)
    self._reqs = RequestTable(config, self._ledger)
    self._moves: dict[int, tuple[str, str]] = {}  # balancer moves in flight: id -> (donor, target)
    self._last_progress = now  # tokens, completions, loads, readiness, new work

  # ----- reads -----------------------------------------------------------------------------------
  @property
  def fleet(self) -> FleetView:
    """The read-only view of the workers and the journals (`view.FleetView`)."""
    return self._view

  @property
  def num_open(self) -> int:
    """Requests submitted and not finished (completions waiting for `poll` excluded)."""
    return self._reqs.num_open

  @property
  def last_progress(self) -> float:
    """Clock time of the last token, completion, weight load, ready worker or new work."""
    return self._last_progress

  def num_done(self) -> int:
    """Completions waiting to be taken."""
    return self._reqs.num_done()

  def num_pending(self) -> int:
    """Requests submitted and not yet returned by `take_completions` or an abort."""
    return len(self._reqs)

  def snapshot(self) -> list[Request]:
    """Copies of every unfinished request's token state (id order), without stopping anything:
    a checkpoint of the in-flight rollout; resubmitting them resumes exactly."""
    return self._reqs.snapshot()

  def metrics(self) -> dict:
    """Cumulative counters (`ManagerStats`) plus gauges: live workers, version lag (newest
    published version minus the oldest one a live worker serves), weight loads."""
    out = self._ledger.stats.counters()
    out.update(self._table.gauges())
    return out

  def describe(self) -> str:
    """A one-paragraph account of the rollout state (for stall errors)."""
    return (f"{self._table.describe()}; {len(self._reqs.queue)} requests queued (min_version "
            f"{self._reqs.queued_min_versions()}); newest weight version {self._table.latest}; "
            f"last events: {self._ledger.events[-5:]}")

  def worker_times(self, now: float) -> dict[str, tuple[float, float, bool]]:
    """Per worker ever seen: `(busy seconds so far, time of its last finished response,
    local)`; busy = holding at least one request (the offload controller's t_remote and
    t_wait_remote come from differences of these over a step)."""
    return self._table.worker_times(now)

  def remote_worker_seconds(self, now: float) -> float:
    """The integral over time of the number of remote workers, up to `now`."""
    return self._table.remote_worker_seconds(now)

  # ----- outputs ---------------------------------------------------------------------------------
  def outbox(self) -> Iterator[tuple[str, Commands]]:
    """`(worker_id, Commands)` of each exchange due, one at a time (call `on_sent` after
    sending each)."""
    return self._table.outbox()

  def outstanding(self) -> list[str]:
    """Workers with an exchange in flight, in join order."""
    return self._table.outstanding()

  def exchange_due(self) -> bool:
    """A synchronous worker has an exchange due."""
    return self._table.exchange_due()

  def take_effects(self) -> list[Effect]:
    """The effects produced since the last call, in order (the exchange loop carries them out)."""
    effects = self._ledger.effects
    if not effects:
      return []
    out = list(effects)
    effects.clear()
    return out

  def take_completions(self) -> list[Completion]:
    """The completions finished since the last call; their requests are forgotten."""
    return self._reqs.take_completions()

  def raise_failures(self) -> None:
    """Raises the first `RequestFailedError` / `WeightLoadError` recorded since the last call."""
    failed = self._ledger.failures
    if failed:
      err = failed[0]
      failed.clear()
      raise err

  # ----- events ----------------------------------------------------------------------------------
  def submit(self, requests: Sequence[Request], now: float) -> None:
    """Queues fresh or partial requests (dispatched at the next tick)."""
    self._reqs.submit(requests, now)
    self._last_progress = now

  def publish(self, version: int, now: float) -> None:
    """`version` is published (effect `Publish`: the exchange loop writes it to the store); each
    worker loads it at its next exchange once the store committed it (`on_committed`)."""
    self._ledger.effects.append(Publish(int(version)))
    self._table.publish(version, now)
    self._last_progress = now

  def awaiting_commit(self) -> tuple[int, bool] | None:
    """While the store has not committed the newest published version: `(that version, whether
    a worker waits to be told to load it)`; else None."""
    version = self._table.awaiting_commit()
    return None if version is None else (version, self._table.load_waiting())

  def on_committed(self, ref: Any) -> None:
    """The store committed the newest version: `ref` (a `WeightRef`) is what workers load."""
    self._table.on_committed(ref)

  def add_worker(self, worker_id: str, now: float, *, local: bool, synchronous: bool) -> None:
    """A worker joins (see `WorkerTable.add`)."""
    self._table.add(worker_id, now, local=local, synchronous=synchronous)

  def forget_workers(self) -> None:
    """Every worker is gone at once (the manager closed; the exchange loop killed them)."""
    self._table.clear()

  def set_accepting(self, worker_id: str, accepting: bool) -> None:
    """Enables / disables dispatch to a worker (e.g. the trainer's seeding engines)."""
    self._table.set_accepting(worker_id, accepting)

  def set_cap(self, n: int | None) -> None:
    """The remote workers wanted (the offload controller's N_prem; None: no cap)."""
    self._table.set_cap(n)

  def on_sent(self, worker_id: str, now: float) -> None:
    """An exchange with `worker_id` started at `now`."""
    self._table.on_sent(worker_id, now)

  def on_lost(self, worker_id: str, reason: str, now: float, *, failure: bool = False) -> None:
    """A worker is gone: it is killed (no zombies) and every request it held migrates.

    `failure=True` when the worker broke with an error while generating (the requests it held
    may have caused it): each counts one attempt against `config.max_attempts`. Otherwise it was
    preempted (lost, killed, removed, silent), which is not the requests' fault."""
    ws = self._table.remove(worker_id, now)
    if ws is None:
      return
    moved = list(ws.assigned)
    self._ledger.events.append((now, "lost", worker_id, f"{reason}; {len(moved)} migrated"))
    for rid in reversed(moved):
      st = self._reqs[rid]
      st.owner, st.target, st.moving = None, None, False
      if st.aborting:
        continue  # the abort collects it
      if not failure:
        st.preempted += 1
      else:
        st.attempts += 1
        if st.attempts > self._config.max_attempts:
          self._ledger.failures.append(RequestFailedError(
              f"request {rid} failed: the workers serving it failed {st.attempts} times (last: "
              f"{worker_id}: {reason}); {st.preempted} preemptions not counted. Raise "
              f"--rollout.max_request_failures (ManagerConfig.max_attempts) or check the workers"))
          continue
      self._reqs.queue.appendleft(rid)
      self._ledger.stats.migrated += 1
    self._reqs.cut_migrated([r for r in moved if not self._reqs[r].aborting])
    self._table.update_gc()

  def retire_worker(self, worker_id: str, now: float) -> None:
    """Graceful removal: stop sending work, abort its requests (re-queued with every token kept,
    no attempt counted) and drop it once all are acknowledged."""
    self._table[worker_id].retiring = True
    self.evacuate(worker_id, None, None, now)

  def evacuate(self, worker_id: str, request_ids: Iterable[int] | None, target: str | None,
               now: float) -> int:
    """Moves requests off a live worker (all when None): abort there, re-queue on the
    acknowledgement (towards `target` if given). Returns how many were asked to move."""
    ws = self._table[worker_id]
    ids = list(ws.assigned) if request_ids is None else [int(i) for i in request_ids]
    n = 0
    for rid in ids:
      st = self._reqs.get(rid)
      if st is None or st.done or st.owner != worker_id or st.moving:
        continue
      st.moving, st.target = True, target
      if target is not None:
        self._moves[rid] = (worker_id, target)
      self._abort_on_owner(st, now)
      n += 1
    return n

  def on_report(self, rep: WorkerReport, now: float) -> bool:
    """Applies one worker report (its exchange is over); returns True when it carried news.
    Reports of unknown (lost) workers are ignored."""
    ws = self._table.get(rep.worker_id)
    if ws is None:
      self._ledger.stats.ignored_reports += 1
      return False
    ws.outstanding = False
    if rep.fatal:
      for c in rep.chunks:  # tokens produced before the failure are kept
        self._reqs.on_chunk(ws, c, now)
      self.on_lost(rep.worker_id, f"worker failed: {rep.fatal}", now, failure=True)
      return True
    first = self._table.observe(ws, rep, now)
    if first or rep.loads or rep.chunks:
      self._last_progress = now
    for rid, message in rep.rejected:
      st = self._reqs.get(rid)
      if st is not None and st.owner == rep.worker_id:
        ws.release(rid, now)
        self._ledger.failures.append(RequestFailedError(
            f"request {rid} was rejected by worker {rep.worker_id}: {message}"))
    for c in rep.chunks:
      self._reqs.on_chunk(ws, c, now)
    if first or rep.loads:
      self._table.update_gc()
    return bool(rep.chunks or rep.loads or rep.rejected or first)

  def begin_tick(self, now: float) -> None:
    """A tick starts at `now` (before the tick hooks run): the remote-worker integral advances
    with the fleet as it was."""
    self._table.remote_worker_seconds(now)

  def tick(self, now: float) -> bool:
    """Heartbeats, weight loads, dispatch and load balancing at `now`; returns whether
    something changed."""
    changed = False
    for ws in self._table.states():
      limit = self._config.heartbeat_timeout if ws.version >= 0 else self._config.startup_timeout
      if ws.outstanding and now - ws.sent_at > limit:
        self.on_lost(ws.worker_id, f"no report within {limit:.0f} s", now)
        changed = True
        continue
      changed |= self._table.tend(ws, now)
    self._table.send_loads(now)
    changed |= self._dispatch(now)
    if self._config.balance:
      changed |= self._balance(now)
    return changed

  def dispatch_due(self, now: float) -> bool:
    """Dispatches the queued requests now when a synchronous worker's exchange is due: that
    exchange runs an engine step at once (inside `receive`), so a request queued since the last
    tick (an episode's next turn, submitted while other requests decode) would otherwise miss
    it and wait a whole step. Asynchronous workers take their commands at their next exchange,
    which starts after the tick anyway. Returns whether a request was dispatched."""
    if not self._reqs.queue or not self._table.exchange_due():
      return False
    return self._dispatch(now)

  # ----- aborts ----------------------------------------------------------------------------------
  def begin_abort(self, request_ids: Iterable[int] | None,
                  now: float) -> tuple[list[int], list[Request]]:
    """Starts stopping requests (all unfinished when None; unknown and finished ids are
    ignored): queued ones are dropped at once, the others are aborted on their owners. Returns
    `(ids asked for, requests dropped)`; `end_abort` once `abort_waiting` is False."""
    want, dropped = self._reqs.unfinished(request_ids), []
    queued = set(self._reqs.queue)
    for rid in want:
      if rid in queued:
        dropped.append(self._reqs.drop(rid))
      else:
        st = self._reqs[rid]
        st.aborting = True
        self._abort_on_owner(st, now)
    return want, dropped

  def abort_waiting(self, want: Sequence[int]) -> bool:
    """Some request of `want` being aborted still has an owner to acknowledge it."""
    return self._reqs.abort_waiting(want)

  def abort_owners(self, want: Sequence[int]) -> list[str]:
    """The owners of `want`'s requests (sorted, as text), for a missing acknowledgement."""
    return self._reqs.abort_owners(want)

  def end_abort(self, want: Sequence[int], dropped: Sequence[Request]) -> list[Request]:
    """Drops the aborted requests of `want`; returns them with `dropped`, in id order."""
    return self._reqs.end_abort(want, dropped)

  def _abort_on_owner(self, st: ReqState, now: float) -> None:
    """Asks the owner to stop `st`; a submit still unsent is simply withdrawn."""
    rid = st.request.request_id
    ws = self._table.get(st.owner) if st.owner is not None else None
    if ws is not None and not ws.unsend(rid):
      ws.commands.abort.append(rid)
      return
    if ws is not None:
      ws.release(rid, now)
    self._reqs.acknowledged(st)

  # ----- routing ---------------------------------------------------------------------------------
  def _dispatch(self, now: float) -> bool:
    queue = self._reqs.queue
    if not queue:
      return False
    loads = {w.worker_id: w for w in self._table.loads()}
    theta, left, sent = self._config.theta, collections.deque(), False
    while queue:
      if not any(w.accepting and w.room(theta) > 0 for w in loads.values()):
        left.extend(queue)
        break
      rid = queue.popleft()
      st = self._reqs[rid]
      # A balancer move names its target; else a session's next request prefers the worker
      # that served its previous one (sticky sessions: that engine may reuse its KV).
      prefer = st.target if st.target is not None else self._reqs.session_worker(st.request)
      wid = balance.select_worker(list(loads.values()), st.request.min_version, theta, prefer)
      if wid is None:
        left.append(rid)
        continue
      ws = self._table[wid]
      ws.commands.submit.append(dataclasses.replace(st.request))
      ws.assign(rid, now)
      st.owner, st.target = wid, None
      loads[wid] = dataclasses.replace(loads[wid], pending=loads[wid].pending + 1)
      sent = True
    self._reqs.queue = left
    return sent

  def _settled_loads(self) -> list[balance.WorkerLoad]:
    """The routing view with the balancer's moves in flight settled (`balance.settle`); moves
    whose request finished, stopped moving or lost its donor are forgotten."""
    moves = []
    for rid, (donor, target) in list(self._moves.items()):
      st = self._reqs.get(rid)
      if st is None or not st.moving or st.owner != donor or donor not in self._table:
        del self._moves[rid]
        continue
      moves.append((donor, target, rid in self._table[donor].running))
    return balance.settle(self._table.loads(), moves)

  def _balance(self, now: float) -> bool:
    if self._reqs.queue:
      return False  # the queue feeds idle workers first
    loads = self._settled_loads()
    reqs, events = self._reqs, self._ledger.events
    moved = False
    for donor, receiver, n in balance.pending_moves(loads):
      ws, version = self._table[donor], self._table[receiver].version
      unsent = {r.request_id for r in ws.commands.submit}  # not waiting there yet: in transit
      pending = [r for r in ws.assigned if r not in ws.running and not reqs[r].moving
                 and r not in unsent and reqs[r].request.min_version <= version]
      k = self.evacuate(donor, pending[-n:], receiver, now)
      if k:
        events.append((now, "move", donor, f"{k} pending to {receiver}"))
      moved |= k > 0
    if moved:
      return True
    move = balance.running_moves(loads, self._config.theta)
    if move is None and self._config.tail_balance:
      move = balance.tail_moves(loads, self._config.theta)
    if move is None:
      return False
    donor, receiver, n = move
    ws, rv = self._table[donor], self._table[receiver]
    cands = sorted((r for r in ws.assigned if r in ws.running and not reqs[r].moving
                    and reqs[r].request.min_version <= rv.version),
                   key=lambda r: (reqs[r].request.num_generated, r))
    k = self.evacuate(donor, cands[:n], receiver, now)
    if k:
      events.append((now, "move", donor, f"{k} running to {receiver}"))
    return k > 0

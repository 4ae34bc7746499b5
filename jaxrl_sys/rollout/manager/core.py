"""The rollout manager's state machine: request token state, workers, routing, migration,
balancing (no I/O: `manager.exchange.RolloutManager` holds one and drives it with the exchange
loop).

Events: `submit`, `on_report` (chunks, pulls, rejections of one worker exchange), `add_worker`,
`on_lost`, `publish`, `tick` (hooks, heartbeats, weight pulls, dispatch, balancing).
Every decision depends only on the events and the injected clock's readings, so the simulator
drives the same code on a virtual clock.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Iterable, Sequence

from jaxrl_sys.rollout.manager import balance
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.manager.config import (ManagerConfig, RequestFailedError,
                                              WeightPullError)
from jaxrl_sys.rollout.manager.state import ManagerStats, ReqState, WorkerState
from jaxrl_sys.rollout.types import Completion, FinishReason, Request, TokenChunk
from jaxrl_sys.rollout.weights.base import WeightStore
from jaxrl_sys.rollout.weights.memory import MemoryWeightStore
from jaxrl_sys.rollout.workers.protocol import Worker, WorkerReport

TickHook = Callable[["ManagerCore", float], None]  # hook(state machine, now)


def describe_store(store: Any) -> str:
  """A weight store's kind and location, for error messages."""
  where = getattr(store, "url", None) or getattr(store, "path", None)
  return f"{type(store).__name__}({where})" if where else type(store).__name__


class ManagerCore:
  """The event-driven state machine a `RolloutManager` holds (see the module docstring)."""

  def __init__(self, workers: Sequence[Worker] = (), store: WeightStore | None = None,
               config: ManagerConfig = ManagerConfig(), clock: Clock = WALL):
    self.config, self.clock = config, clock
    self.store = store if store is not None else MemoryWeightStore()
    self.workers: dict[str, WorkerState] = {}
    self.requests: dict[int, ReqState] = {}
    self.queue: collections.deque[int] = collections.deque()
    self.latest = -1
    self.stats = ManagerStats()
    self.events: list[tuple[float, str, str, str]] = []  # (time, kind, worker, detail)
    self._done: list[Completion] = []
    self._failed: list[RuntimeError] = []  # raised by the next poll
    self._pull_failures: dict[int, list[tuple[str, str]]] = {}  # version -> (worker, message)
    self.last_progress = clock.now()  # tokens, completions, pulls, readiness, new work
    self._hooks: list[TickHook] = []
    self._provenance: dict[int, list[tuple[str, int, int]]] = {}
    self._in_use: frozenset[int] = frozenset()
    self._open = 0  # unfinished requests
    self._moves: dict[int, tuple[str, str]] = {}  # balancer moves in flight: id -> (donor, target)
    self.worker_cap: int | None = None  # remote workers wanted (the controller's N_prem)
    self.busy_of_gone: dict[str, tuple[float, float, bool]] = {}  # lost / retired workers
    self._remote_seconds = 0.0  # integral of the remote-worker count over time
    self._last_tick = clock.now()
    # Sticky sessions: the worker that finished a session's last request (LRU, bounded).
    self._sessions: collections.OrderedDict[Any, str] = collections.OrderedDict()
    for w in workers:
      self.add_worker(w)

  def submit(self, requests: Sequence[Request]) -> None:
    """Queues fresh or partial requests (dispatched at the next round)."""
    batch = list(requests)
    ids = [r.request_id for r in batch]
    if len(set(ids)) != len(ids):
      raise ValueError(f"duplicate request ids in one submit: {sorted(ids)}")
    for r in batch:
      if r.request_id in self.requests:
        raise ValueError(f"request {r.request_id} is already in flight in the rollout manager")
    now = self.clock.now()
    for r in batch:
      self.requests[r.request_id] = ReqState(dataclasses.replace(r), submitted_at=now,
                                             target=self._session_worker(r))
      self._provenance[r.request_id] = []
      self.queue.append(r.request_id)
    self._open += len(batch)
    self.stats.submitted += len(batch)
    self.last_progress = now

  def _session_worker(self, r: Request) -> str | None:
    """Sticky sessions: the worker that served the previous request of `r`'s session
    (`meta["session"]`, e.g. the previous turn of an episode), while it is alive: dispatch
    prefers it (its engine still holds the session's KV)."""
    session = r.meta.get("session") if self.config.sticky_sessions else None
    wid = None if session is None else self._sessions.get(session)
    return wid if wid in self.workers else None

  def publish(self, params: Any, version: int, moe_state: Any = None) -> None:
    """Publishes `version` to the store; each worker pulls it at its next exchange (once the
    store has committed it) and serves it from then on."""
    self.store.publish(int(version), params, moe_state)
    self.latest = int(version)
    self.last_progress = self.clock.now()
    self.events.append((self.clock.now(), "publish", "", str(version)))

  def add_worker(self, worker: Worker) -> None:
    """A worker joins: it is told to pull the newest committed version at its first exchange
    and receives work once it serves a version the requests allow."""
    if worker.worker_id in self.workers:
      raise ValueError(f"worker {worker.worker_id} is already registered")
    self.workers[worker.worker_id] = WorkerState(worker, joined_at=self.clock.now())
    self.stats.joined += 1
    self.events.append((self.clock.now(), "join", worker.worker_id, ""))

  def on_lost(self, worker_id: str, reason: str, *, failure: bool = False) -> None:
    """A worker is gone: kill it (no zombies) and migrate every request it held.

    `failure=True` when the worker broke with an error while generating (the requests it held
    may have caused it): each counts one attempt against `config.max_attempts`. Otherwise it was
    preempted (lost, killed, removed, silent), which is not the requests' fault."""
    ws = self.workers.pop(worker_id, None)
    if ws is None:
      return
    ws.worker.kill()
    ws.close_busy(self.clock.now())
    self.busy_of_gone[worker_id] = (ws.busy_total, ws.last_done, ws.worker.local)
    self.stats.lost += 1
    moved = list(ws.assigned)
    self.events.append((self.clock.now(), "lost", worker_id, f"{reason}; {len(moved)} migrated"))
    for rid in reversed(moved):
      st = self.requests[rid]
      st.owner, st.target, st.moving = None, None, False
      if st.aborting:
        continue  # abort() collects it
      if not failure:
        st.preempted += 1
      else:
        st.attempts += 1
        if st.attempts > self.config.max_attempts:
          self._failed.append(RequestFailedError(
              f"request {rid} failed: the workers serving it failed {st.attempts} times (last: "
              f"{worker_id}: {reason}); {st.preempted} preemptions not counted. Raise "
              f"--rollout.max_request_failures (ManagerConfig.max_attempts) or check the workers"))
          continue
      self.queue.appendleft(rid)
      self.stats.migrated += 1
    self._cut_migrated([r for r in moved if not self.requests[r].aborting])
    self._update_gc()

  def _cut_migrated(self, ids: list[int]) -> None:
    """What a migrated request keeps: every token (ours); or, as ablations, nothing
    (`migrate_tokens=False`: restart from the prompt) or the shortest sibling's length of its
    group (`trim_siblings=True`, RLBoost's released retry path)."""
    keep = {rid: self.requests[rid].request.num_generated for rid in ids}
    if self.config.trim_siblings:
      shortest: dict[int, int] = {}
      for rid in ids:
        g = self.requests[rid].request.group_id
        shortest[g] = min(shortest.get(g, keep[rid]), keep[rid])
      keep = {rid: shortest[self.requests[rid].request.group_id] for rid in ids}
    if not self.config.migrate_tokens:
      keep = dict.fromkeys(ids, 0)
    for rid in ids:
      r, n = self.requests[rid].request, keep[rid]
      self.stats.tokens_kept += n
      self.stats.tokens_discarded += r.num_generated - n
      if n < r.num_generated:
        r.tokens, r.logprobs, r.versions = r.tokens[:n], r.logprobs[:n], r.versions[:n]
        prov = self._provenance.get(rid, [])
        self._provenance[rid] = [(w, a, min(b, n)) for w, a, b in prov if a < n]

  @property
  def num_open(self) -> int:
    """Requests submitted and not finished (completions waiting for `poll` excluded)."""
    return self._open

  def num_done(self) -> int:
    """Completions waiting to be taken."""
    return len(self._done)

  def take_completions(self) -> list[Completion]:
    """The completions finished since the last call; their requests are forgotten."""
    out, self._done = self._done, []
    for c in out:
      self.requests.pop(c.request_id, None)
    return out

  def raise_failures(self) -> None:
    """Raises the first `RequestFailedError` recorded since the last call, if any."""
    if self._failed:
      err, self._failed = self._failed[0], []
      raise err

  def remove_worker(self, worker_id: str, reason: str = "removed") -> None:
    """Kills a worker now (e.g. a preemption from a trace): same as a loss."""
    self.on_lost(worker_id, reason)

  def retire_worker(self, worker_id: str) -> None:
    """Graceful removal: stop sending work, abort its requests (re-queued with every token kept,
    no attempt counted) and drop it once all are acknowledged."""
    ws = self.workers[worker_id]
    ws.retiring = True
    self.evacuate(worker_id)

  def evacuate(self, worker_id: str, request_ids: Iterable[int] | None = None,
               target: str | None = None) -> int:
    """Moves requests off a live worker (all when None): abort there, re-queue on the
    acknowledgement (towards `target` if given). Returns how many were asked to move."""
    ws = self.workers[worker_id]
    ids = list(ws.assigned) if request_ids is None else [int(i) for i in request_ids]
    n = 0
    for rid in ids:
      st = self.requests.get(rid)
      if st is None or st.done or st.owner != worker_id or st.moving:
        continue
      st.moving, st.target = True, target
      if target is not None:
        self._moves[rid] = (worker_id, target)
      self.abort_on_owner(st)
      n += 1
    return n

  def set_accepting(self, worker_id: str, accepting: bool) -> None:
    """Enables / disables dispatch to a worker (e.g. the trainer's seeding engines)."""
    self.workers[worker_id].disabled = not accepting

  def has_hooks(self) -> bool:
    """Whether a tick hook (e.g. a fleet that starts workers) is installed."""
    return bool(self._hooks)

  def add_tick_hook(self, hook: TickHook) -> None:
    """`hook(manager, now)` runs at every tick (trace players, autoscalers, controllers)."""
    self._hooks.append(hook)

  def metrics(self) -> dict:
    """Cumulative counters (`ManagerStats`) plus gauges: live workers, version lag (newest
    published version minus the oldest one a live worker serves), weight pulls."""
    out = self.stats.counters()
    versions = [ws.version for ws in self.workers.values() if ws.version >= 0]
    pulls = self.stats.pull_seconds
    out.update(live_workers=len(self.workers), pulls=len(pulls), pull_seconds=float(sum(pulls)),
               version_lag=(self.latest - min(versions)) if versions and self.latest >= 0 else 0)
    return out

  def remote_worker_seconds(self) -> float:
    """The integral over time of the number of remote workers, up to now."""
    now = self.clock.now()
    remote = sum(1 for ws in self.workers.values() if not ws.worker.local)
    self._remote_seconds += remote * max(now - self._last_tick, 0.0)
    self._last_tick = now
    return self._remote_seconds

  def worker_times(self) -> dict[str, tuple[float, float, bool]]:
    """Per worker ever seen: `(busy seconds so far, time of its last finished response,
    local)`; busy = holding at least one request (the offload controller's t_remote and
    t_wait_remote come from differences of these over a step)."""
    now = self.clock.now()
    out = dict(self.busy_of_gone)
    for wid, ws in self.workers.items():
      out[wid] = (ws.busy_now(now), ws.last_done, ws.worker.local)
    return out

  def describe(self) -> str:
    """A one-paragraph account of the rollout state (for stall errors)."""
    ws = ", ".join(f"{w.worker_id}: v{w.version} holds {len(w.assigned)}"
                   f"{' (retiring)' if w.retiring else ''}" for w in self.workers.values())
    gated = sorted({self.requests[r].request.min_version for r in self.queue})
    return (f"{len(self.workers)} live workers [{ws}]; {len(self.queue)} requests queued "
            f"(min_version {gated}); newest weight version {self.latest}; last events: "
            f"{self.events[-5:]}")

  def snapshot(self) -> list[Request]:
    """Copies of every unfinished request's token state (id order), without stopping anything:
    a checkpoint of the in-flight rollout; resubmitting them resumes exactly."""
    return [dataclasses.replace(st.request) for rid, st in sorted(self.requests.items())
            if not st.done]

  def provenance(self, request_id: int) -> list[tuple[str, int, int]]:
    """`(worker_id, start, end)` token ranges of a request, in the order they were produced."""
    return list(self._provenance.get(request_id, ()))

  def on_report(self, rep: WorkerReport) -> bool:
    """Applies one worker report; returns True when it carried news. Reports of unknown
    (lost) workers are ignored."""
    ws = self.workers.get(rep.worker_id)
    if ws is None:
      self.stats.ignored_reports += 1
      return False
    now = self.clock.now()
    if rep.fatal:
      for c in rep.chunks:  # tokens produced before the failure are kept
        self._on_chunk(ws, c)
      self.on_lost(rep.worker_id, f"worker failed: {rep.fatal}", failure=True)
      return True
    first = ws.version < 0 and rep.version >= 0
    ws.observe(rep, now, self.config.profile_window)
    if first:
      self.events.append((now, "ready", rep.worker_id, str(rep.version)))
    if first or rep.pulls or rep.chunks:
      self.last_progress = now
    for version, seconds in rep.pulls:
      ws.failed_pulls = 0
      self._pull_failures.pop(int(version), None)
      self.stats.pull_seconds.append(seconds)
      self.events.append((now, "pulled", rep.worker_id, f"v{version} in {seconds:.3f}s"))
    for version, message in rep.failed_pulls:
      self._pull_failed(ws, int(version), message)
    for rid, message in rep.rejected:
      st = self.requests.get(rid)
      if st is not None and st.owner == rep.worker_id:
        ws.release(rid, self.clock.now())
        self._failed.append(RequestFailedError(
            f"request {rid} was rejected by worker {rep.worker_id}: {message}"))
    for c in rep.chunks:
      self._on_chunk(ws, c)
    if first or rep.pulls:
      self._update_gc()
    return bool(rep.chunks or rep.pulls or rep.rejected or first)

  def _pull_failed(self, ws: WorkerState, version: int, message: str) -> None:
    """A worker could not load `version` (it keeps serving its previous one). Pulls are retried
    until `max_pull_failures` failed over all workers; then, while `version` is still the
    newest, the next `poll` raises `WeightPullError` naming the version, the store and why."""
    ws.failed_pulls += 1
    self.events.append((self.clock.now(), "pull_failed", ws.worker_id, f"v{version}: {message}"))
    ws.pull_sent = min(ws.pull_sent, ws.version)  # pull again at the next tick
    fails = self._pull_failures.setdefault(version, [])
    fails.append((ws.worker_id, message))
    if len(fails) == self.config.max_pull_failures + 1 and version == self.latest:
      serving = sorted({w.version for w in self.workers.values() if w.version >= 0})
      self._failed.append(WeightPullError(
          f"weight version {version} could not be loaded from the weight store "
          f"{describe_store(self.store)}: {len(fails)} pulls failed (workers "
          f"{sorted({w for w, _ in fails})}); last error: {message}. The workers keep serving "
          f"version(s) {serving or 'none'}, but the requests waiting for version {version} "
          "cannot run. Check the store's files (a corrupt, truncated or deleted version) and "
          "resume from the last checkpoint (--resume)"))

  def tick(self) -> bool:
    """Hooks, heartbeats, weight pulls, dispatch and load balancing at the clock's time."""
    now = self.clock.now()
    self.remote_worker_seconds()
    for hook in self._hooks:
      hook(self, now)
    changed = False
    for ws in list(self.workers.values()):
      limit = self.config.heartbeat_timeout if ws.version >= 0 else self.config.startup_timeout
      if ws.outstanding and now - ws.sent_at > limit:
        self.on_lost(ws.worker_id, f"no report within {limit:.0f} s")
        changed = True
        continue
      if ws.pull_sent > ws.version and now - ws.pull_sent_at > self.config.pull_timeout:
        self._pull_failed(ws, ws.pull_sent, f"not loaded within {self.config.pull_timeout:.0f} s "
                          "(ManagerConfig.pull_timeout)")
        changed = True
      elif ws.retiring and not ws.assigned and not ws.outstanding:
        self.workers.pop(ws.worker_id)
        self.busy_of_gone[ws.worker_id] = (ws.busy_total, ws.last_done, ws.worker.local)
        self.events.append((now, "retired", ws.worker_id, ""))
        self._update_gc()
        changed = True
    self._send_pulls()
    changed |= self._dispatch()
    if self.config.balance:
      changed |= self._balance()
    return changed

  def _on_chunk(self, ws: WorkerState, c: TokenChunk) -> None:
    st = self.requests.get(c.request_id)
    wid = ws.worker.worker_id
    if st is None or st.done or st.owner != wid:
      self.stats.ignored_chunks += 1
      return
    if c.finish == FinishReason.ABORTED:
      if st.moving or st.aborting:
        ws.release(c.request_id, self.clock.now())
        self._acknowledged(st)
      else:
        self.stats.ignored_chunks += 1
      return
    if c.start != st.request.num_generated:
      self.stats.ignored_chunks += 1
      return
    n = len(c.tokens)
    if n:
      st.request.extend(c.tokens, c.logprobs, c.version)
      prov = self._provenance[c.request_id]
      if prov and prov[-1][0] == wid and prov[-1][2] == c.start:
        prov[-1] = (wid, prov[-1][1], c.start + n)
      else:
        prov.append((wid, c.start, c.start + n))
      self.stats.tokens += n
      if ws.worker.local:
        self.stats.tokens_local += n
    if c.finish is not None:
      ws.last_done = self.clock.now()
      ws.release(c.request_id, self.clock.now())
      session = st.request.meta.get("session")
      if session is not None and self.config.sticky_sessions:
        self._sessions[session] = wid
        self._sessions.move_to_end(session)
        while len(self._sessions) > self.config.max_sessions:
          self._sessions.popitem(last=False)
      self._complete(st, c.finish)

  def _complete(self, st: ReqState, finish: FinishReason) -> None:
    st.done, st.owner, st.moving = True, None, False
    self._open -= 1
    self._done.append(Completion(st.request, finish))
    self.stats.completed += 1

  def drop(self, rid: int) -> Request:
    """Forgets request `rid` (returned by abort) and returns its token state."""
    st = self.requests.pop(rid)
    if not st.done:
      self._open -= 1
    if rid in self.queue:
      self.queue.remove(rid)
    return st.request

  def abort_on_owner(self, st: ReqState) -> None:
    """Asks the owner to stop `st`; a submit still unsent is simply withdrawn."""
    rid = st.request.request_id
    ws = self.workers.get(st.owner) if st.owner is not None else None
    if ws is not None and not ws.unsend(rid):
      ws.commands.abort.append(rid)
      return
    if ws is not None:
      ws.release(rid, self.clock.now())
    self._acknowledged(st)

  def _acknowledged(self, st: ReqState) -> None:
    """The owner let go of `st` (abort acknowledged): abort() collects it, a move re-queues it."""
    st.owner = None
    if st.moving and not st.aborting:
      st.moving = False
      self.queue.appendleft(st.request.request_id)
      self.stats.balanced += 1

  def loads(self) -> list[balance.WorkerLoad]:
    """The routing view of every worker (join order)."""
    out = []
    for wid, ws in self.workers.items():
      running = len(ws.running.intersection(ws.assigned))
      out.append(balance.WorkerLoad(
          wid, ws.version, running, len(ws.assigned) - running, ws.num_slots, ws.accepting(),
          self.config.plateau_batch or ws.plateau(self.config.plateau_frac)))
    return out

  def _send_pulls(self) -> None:
    if self.latest < 0:
      return
    for ws in self.workers.values():
      if max(ws.version, ws.pull_sent) < self.latest:
        ref = self.store.ref(self.latest)
        if ref is None:
          getattr(self.store, "check", lambda: None)()  # a failed write raises, never stalls
          return  # not committed yet
        ws.commands.load, ws.pull_sent, ws.pull_sent_at = ref, self.latest, self.clock.now()

  def _update_gc(self) -> None:
    in_use = frozenset(v for ws in self.workers.values() for v in (ws.version, ws.pull_sent)
                       if v >= 0)
    if in_use != self._in_use:
      self._in_use = in_use
      self.store.gc(in_use)

  def _dispatch(self) -> bool:
    if not self.queue:
      return False
    loads = {w.worker_id: w for w in self.loads()}
    theta, left, sent = self.config.theta, collections.deque(), False
    while self.queue:
      if not any(w.accepting and w.room(theta) > 0 for w in loads.values()):
        left.extend(self.queue)
        break
      rid = self.queue.popleft()
      st = self.requests[rid]
      wid = balance.select_worker(list(loads.values()), st.request.min_version, theta, st.target)
      if wid is None:
        left.append(rid)
        continue
      ws = self.workers[wid]
      ws.commands.submit.append(dataclasses.replace(st.request))
      ws.assign(rid, self.clock.now())
      st.owner, st.target = wid, None
      loads[wid] = dataclasses.replace(loads[wid], pending=loads[wid].pending + 1)
      sent = True
    self.queue = left
    return sent

  def _settled_loads(self) -> list[balance.WorkerLoad]:
    """The routing view with the balancer's moves in flight settled: a request being moved
    counts at its target (pending), no longer at its donor. The balancer runs at every tick, long
    before a donor acknowledges an abort; without this it would move again what is on its way."""
    loads = self.loads()
    gone: collections.Counter = collections.Counter()
    gone_running: collections.Counter = collections.Counter()
    coming: collections.Counter = collections.Counter()
    for rid, (donor, target) in list(self._moves.items()):
      st = self.requests.get(rid)
      if st is None or not st.moving or st.owner != donor or donor not in self.workers:
        del self._moves[rid]
        continue
      running = rid in self.workers[donor].running
      gone[donor] += not running
      gone_running[donor] += running
      coming[target] += 1
    if not coming:
      return loads
    return [dataclasses.replace(w, running=w.running - gone_running[w.worker_id],
                                pending=w.pending - gone[w.worker_id] + coming[w.worker_id])
            for w in loads]

  def _balance(self) -> bool:
    if self.queue:
      return False  # the queue feeds idle workers first
    loads = self._settled_loads()
    moved = False
    for donor, receiver, n in balance.pending_moves(loads):
      ws, version = self.workers[donor], self.workers[receiver].version
      unsent = {r.request_id for r in ws.commands.submit}  # not waiting there yet: in transit
      pending = [r for r in ws.assigned if r not in ws.running and not self.requests[r].moving
                 and r not in unsent and self.requests[r].request.min_version <= version]
      k = self.evacuate(donor, pending[-n:], target=receiver)
      if k:
        self.events.append((self.clock.now(), "move", donor, f"{k} pending to {receiver}"))
      moved |= k > 0
    if moved:
      return True
    move = balance.running_moves(loads, self.config.theta)
    if move is None and self.config.tail_balance:
      move = balance.tail_moves(loads, self.config.theta)
    if move is None:
      return False
    donor, receiver, n = move
    ws, rv = self.workers[donor], self.workers[receiver]
    cands = sorted((r for r in ws.assigned if r in ws.running and not self.requests[r].moving
                    and self.requests[r].request.min_version <= rv.version),
                   key=lambda r: (self.requests[r].request.num_generated, r))
    k = self.evacuate(donor, cands[:n], target=receiver)
    if k:
      self.events.append((self.clock.now(), "move", donor, f"{k} running to {receiver}"))
    return k > 0

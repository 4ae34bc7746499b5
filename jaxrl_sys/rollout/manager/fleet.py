"""The rollout manager's workers: the worker table, weight loads, store garbage collection, the
remote-worker cap and busy accounting (`WorkerTable`).

`WorkerTable` is private to `manager/`: `core.ManagerCore` drives it with the events it
receives, and it writes its effects (kill a worker, release one, collect store garbage) into
the shared `state.Ledger` for the exchange loop to carry out. Everything outside `manager/`
(`elastic/`, `sim/`, benchmarks, tests) reads it through `view.FleetView`, whose answers are
copies or read-only records, and changes it only through the manager's commands
(`add_worker`, `retire_worker`, `set_accepting`, `evacuate`, `set_cap`, ...).
"""
from __future__ import annotations

from typing import Any, Iterator

from jaxrl_sys.rollout.manager import balance
from jaxrl_sys.rollout.manager.config import ManagerConfig, WeightLoadError
from jaxrl_sys.rollout.manager.state import CollectGarbage, Kill, Ledger, Release, WorkerState
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerReport


class WorkerTable:
  """The live workers and everything about them that is not request routing (see the module
  docstring). Times come in as arguments: it reads no clock.

  Args:
    config: the manager's settings (timeouts, load failures, profile window).
    ledger: where counters, events, errors and effects go.
    now: the time the manager starts (the remote-worker integral starts here).
    store_name: the weight store's kind and location, for error messages.
  """

  def __init__(self, config: ManagerConfig, ledger: Ledger, now: float, store_name: str):
    self._config, self._ledger, self._store_name = config, ledger, store_name
    self._ws: dict[str, WorkerState] = {}
    self._latest = -1
    self._committed: Any = None  # the store's `WeightRef` of `_latest` once committed
    self._in_use: frozenset[int] = frozenset()
    self._load_failures: dict[int, list[tuple[str, str]]] = {}  # version -> (worker, message)
    self._cap: int | None = None  # remote workers wanted (the offload controller's N_prem)
    self._busy_of_gone: dict[str, tuple[float, float, bool]] = {}  # lost / retired workers
    self._remote_seconds = 0.0  # integral of the remote-worker count over time
    self._last_tick = now

  # ----- the table -----------------------------------------------------------------------------
  @property
  def records(self) -> dict[str, WorkerState]:
    """The live workers' records by id, in join order (the dict itself: `view.TableView` reads
    it; only this table writes it)."""
    return self._ws

  def get(self, worker_id: str) -> WorkerState | None:
    return self._ws.get(worker_id)

  def __getitem__(self, worker_id: str) -> WorkerState:
    return self._ws[worker_id]

  def __contains__(self, worker_id: object) -> bool:
    return worker_id in self._ws

  def __len__(self) -> int:
    return len(self._ws)

  def states(self) -> list[WorkerState]:
    """Every live worker's record, in join order (a list: safe to change the table while
    iterating)."""
    return list(self._ws.values())

  @property
  def latest(self) -> int:
    return self._latest

  @property
  def cap(self) -> int | None:
    return self._cap

  def set_cap(self, n: int | None) -> None:
    if n is not None and int(n) < 0:
      raise ValueError(f"the remote-worker cap must be >= 0 or None, got {n}")
    self._cap = None if n is None else int(n)

  def add(self, worker_id: str, now: float, *, local: bool, synchronous: bool) -> None:
    """A worker joins: it is told to load the newest committed version at its first exchange
    and receives work once it serves a version the requests allow."""
    if worker_id in self._ws:
      raise ValueError(f"worker {worker_id} is already registered")
    self._ws[worker_id] = WorkerState(worker_id, now, local=local, synchronous=synchronous)
    self._ledger.stats.joined += 1
    self._ledger.events.append((now, "join", worker_id, ""))

  def remove(self, worker_id: str, now: float) -> WorkerState | None:
    """A worker is gone: it is killed (effect) and its busy time kept; returns its record (the
    core migrates what it held), or None when it was not live."""
    ws = self._ws.pop(worker_id, None)
    if ws is None:
      return None
    self._ledger.effects.append(Kill(worker_id))
    ws.close_busy(now)
    self._busy_of_gone[worker_id] = (ws.busy_total, ws.last_done, ws.local)
    self._ledger.stats.lost += 1
    return ws

  def clear(self) -> None:
    """Forgets every worker (the manager closed; their handles are killed by the caller)."""
    self._ws.clear()

  def set_accepting(self, worker_id: str, accepting: bool) -> None:
    self._ws[worker_id].disabled = not accepting

  # ----- exchanges -----------------------------------------------------------------------------
  def outbox(self) -> Iterator[tuple[str, Commands]]:
    """The exchanges due now, one worker at a time in join order: its queued commands, taken.
    Due: no exchange outstanding, and commands or held requests (synchronous workers) or always
    (asynchronous ones: their outstanding exchange is their heartbeat)."""
    for ws in list(self._ws.values()):
      if not ws.outstanding and (ws.should_exchange() or not ws.synchronous):
        yield ws.worker_id, ws.take_commands()

  def on_sent(self, worker_id: str, now: float) -> None:
    ws = self._ws[worker_id]
    ws.outstanding, ws.sent_at = True, now

  def outstanding(self) -> list[str]:
    """Workers with an exchange outstanding, in join order."""
    return [w for w, ws in self._ws.items() if ws.outstanding]

  def exchange_due(self) -> bool:
    """A synchronous worker has an exchange due (the next round serves it at once)."""
    return any(ws.synchronous and ws.should_exchange() for ws in self._ws.values())

  def observe(self, ws: WorkerState, rep: WorkerReport, now: float) -> bool:
    """Takes a report's worker state and weight loads; returns whether the worker just became
    ready (its first version)."""
    first = ws.version < 0 and rep.version >= 0
    ws.observe(rep, now, self._config.profile_window)
    events = self._ledger.events
    if first:
      events.append((now, "ready", rep.worker_id, str(rep.version)))
    for version, seconds in rep.loads:
      ws.failed_loads = 0
      self._load_failures.pop(int(version), None)
      self._ledger.stats.load_seconds.append(seconds)
      events.append((now, "pulled", rep.worker_id, f"v{version} in {seconds:.3f}s"))
    for version, message in rep.failed_loads:
      self.load_failed(ws, int(version), message, now)
    return first

  # ----- weights -------------------------------------------------------------------------------
  def publish(self, version: int, now: float) -> None:
    """`version` is being published: every worker is told to load it once it is committed."""
    self._latest, self._committed = int(version), None
    self._ledger.events.append((now, "publish", "", str(version)))

  def awaiting_commit(self) -> int | None:
    """The newest published version while the store has not committed it yet, else None."""
    return self._latest if self._latest >= 0 and self._committed is None else None

  def load_waiting(self) -> bool:
    """Some worker waits to be told to load the newest version."""
    return any(max(ws.version, ws.load_sent) < self._latest for ws in self._ws.values())

  def on_committed(self, ref: Any) -> None:
    """The store committed `ref.version` (a `WeightRef`); only the newest version is sent."""
    if int(ref.version) == self._latest:
      self._committed = ref

  def send_loads(self, now: float) -> None:
    """Tells every worker behind the newest version to load it (once committed)."""
    if self._latest < 0:
      return
    for ws in self._ws.values():
      if max(ws.version, ws.load_sent) < self._latest:
        if self._committed is None:
          return  # not committed yet
        ws.commands.load, ws.load_sent, ws.load_sent_at = self._committed, self._latest, now

  def load_failed(self, ws: WorkerState, version: int, message: str, now: float) -> None:
    """A worker could not load `version` (it keeps serving its previous one). Loads are retried
    until `max_load_failures` failed over all workers; then, while `version` is still the
    newest, the next `poll` raises `WeightLoadError` naming the version, the store and why."""
    ws.failed_loads += 1
    self._ledger.events.append((now, "pull_failed", ws.worker_id, f"v{version}: {message}"))
    ws.load_sent = min(ws.load_sent, ws.version)  # load again at the next tick
    fails = self._load_failures.setdefault(version, [])
    fails.append((ws.worker_id, message))
    if len(fails) == self._config.max_load_failures + 1 and version == self._latest:
      serving = sorted({w.version for w in self._ws.values() if w.version >= 0})
      self._ledger.failures.append(WeightLoadError(
          f"weight version {version} could not be loaded from the weight store "
          f"{self._store_name}: {len(fails)} pulls failed (workers "
          f"{sorted({w for w, _ in fails})}); last error: {message}. The workers keep serving "
          f"version(s) {serving or 'none'}, but the requests waiting for version {version} "
          "cannot run. Check the store's files (a corrupt, truncated or deleted version) and "
          "resume from the last checkpoint (--resume)"))

  def update_gc(self) -> None:
    """Collects the store's versions no live worker serves or loads (when that set changed)."""
    in_use = frozenset(v for ws in self._ws.values() for v in (ws.version, ws.load_sent)
                       if v >= 0)
    if in_use != self._in_use:
      self._in_use = in_use
      self._ledger.effects.append(CollectGarbage(in_use))

  def tend(self, ws: WorkerState, now: float) -> bool:
    """A live worker's timers at a tick (heartbeats are the core's): a load past
    `load_timeout` fails; a retiring worker holding nothing is dropped. Returns whether
    something changed."""
    config = self._config
    if ws.load_sent > ws.version and now - ws.load_sent_at > config.load_timeout:
      self.load_failed(ws, ws.load_sent, f"not loaded within {config.load_timeout:.0f} s "
                       "(ManagerConfig.load_timeout)", now)
      return True
    if ws.retiring and not ws.assigned and not ws.outstanding:
      self._ws.pop(ws.worker_id)
      self._busy_of_gone[ws.worker_id] = (ws.busy_total, ws.last_done, ws.local)
      self._ledger.events.append((now, "retired", ws.worker_id, ""))
      self._ledger.effects.append(Release(ws.worker_id))
      self.update_gc()
      return True
    return False

  # ----- accounting ----------------------------------------------------------------------------
  def remote_worker_seconds(self, now: float) -> float:
    """The integral over time of the number of remote workers, up to `now` (the count of each
    stretch is the one at its end: a tick or a call of this)."""
    remote = sum(1 for ws in self._ws.values() if not ws.local)
    self._remote_seconds += remote * max(now - self._last_tick, 0.0)
    self._last_tick = now
    return self._remote_seconds

  def worker_times(self, now: float) -> dict[str, tuple[float, float, bool]]:
    """Per worker ever seen: `(busy seconds so far, time of its last finished response,
    local)`; busy = holding at least one request."""
    out = dict(self._busy_of_gone)
    for wid, ws in self._ws.items():
      out[wid] = (ws.busy_now(now), ws.last_done, ws.local)
    return out

  def loads(self) -> list[balance.WorkerLoad]:
    """The routing view of every worker (join order)."""
    plateau_batch, plateau_frac = self._config.plateau_batch, self._config.plateau_frac
    out = []
    for wid, ws in self._ws.items():
      running = len(ws.running.intersection(ws.assigned))
      out.append(balance.WorkerLoad(
          wid, ws.version, running, len(ws.assigned) - running, ws.num_slots, ws.accepting(),
          plateau_batch or ws.plateau(plateau_frac)))
    return out

  def gauges(self) -> dict:
    """Live workers, weight loads so far (`pulls`, `pull_seconds`) and the version lag (newest
    published version minus the oldest one a live worker serves)."""
    versions = [ws.version for ws in self._ws.values() if ws.version >= 0]
    loads = self._ledger.stats.load_seconds
    lag = (self._latest - min(versions)) if versions and self._latest >= 0 else 0
    return dict(live_workers=len(self._ws), pulls=len(loads), pull_seconds=float(sum(loads)),
                version_lag=lag)

  def describe(self) -> str:
    ws = ", ".join(f"{w.worker_id}: v{w.version} holds {len(w.assigned)}"
                   f"{' (retiring)' if w.retiring else ''}" for w in self._ws.values())
    return f"{len(self._ws)} live workers [{ws}]"

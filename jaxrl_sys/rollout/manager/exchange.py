"""The rollout manager: every request's token-level state, routed over workers that come and go.

`RolloutManager` implements `RolloutClient` towards the trainer's loop and is a deterministic,
event-driven state machine towards its workers. It holds each unfinished request (prompt,
tokens so far, their logprobs and per-token weight versions) as the single source of truth and
reacts to events:

- `submit(requests)`: queue them;
- a worker's report: its chunks extend their requests (only from the request's owner and only
  at `TokenChunk.start == tokens so far`: late or duplicated chunks are ignored), finished
  requests become completions, abort acknowledgements re-queue requests;
- `add_worker(worker)` / a loss: a joining worker is told to load the newest weights; a lost
  one's requests are re-queued at the front as prompt + tokens so far with the remaining budget
  (token-level migration: one prefill elsewhere, no decode work lost, and the same per-request
  randomness, so the final response equals the undisturbed one);
- `publish(params, version)`: the version goes to the weight store; workers load it;
- a tick: tick hooks (trace players, fleets, the offload controller), heartbeats, weight loads,
  dispatch (`balance.select_worker`), continuous load balancing (`balance.pending_moves` /
  `running_moves`).

Two halves: `core.ManagerCore` is the state machine (events in, commands and effects out, no
I/O; its tables are `requests.RequestTable` and `fleet.WorkerTable`); `RolloutManager` is the
exchange loop around it (`round`, `poll`, `abort`): it holds the worker handles, the weight
store and the tick hooks, reads the injected `Clock`, feeds the core its events with their
times, sends the commands it gives out and carries out its effects (kill or release a worker,
write a version to the store, collect the store's garbage). Towards the trainer it is a
`RolloutSession` (`submit`, `poll`, `abort`, `snapshot`, `num_pending`, `publish`, `metrics`,
`describe`, `close`, `add_tick_hook`); towards `elastic/` and the simulator a
`view.ElasticPort`: `fleet` (the read-only `view.FleetView`), `clock`, `worker_times`,
`remote_worker_seconds`, `set_cap`, `add_worker`, `remove_worker`, `retire_worker`,
`set_accepting`, `evacuate`. Nothing else changes its state. Workers come only through the
`Worker` interface. `poll()` drives exchanges until enough completions exist, which is all the
I/O there is, so the same code runs over an in-process engine, Ray actors, or the simulator's
virtual workers.
"""
from __future__ import annotations

import collections
import types
from typing import Any, Callable, Iterable, Mapping, Sequence

from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.manager.config import ManagerConfig, RolloutStalledError
from jaxrl_sys.rollout.manager.core import ManagerCore
from jaxrl_sys.rollout.manager.view import FleetView
from jaxrl_sys.rollout.manager.state import CollectGarbage, Kill, Publish, Release
from jaxrl_sys.rollout.types import Completion, Request
from jaxrl_sys.rollout.weights.base import WeightStore
from jaxrl_sys.rollout.weights.memory import MemoryWeightStore
from jaxrl_sys.rollout.workers.protocol import Worker, WorkerLost

TickHook = Callable[["RolloutManager", float], None]  # hook(manager, now)


def describe_store(store: Any) -> str:
  """A weight store's kind and location, for error messages."""
  where = getattr(store, "url", None) or getattr(store, "path", None)
  return f"{type(store).__name__}({where})" if where else type(store).__name__


class RolloutManager:
  """Routes requests over workers; implements `rollout.types.RolloutClient`.

  Args:
    workers: initial workers (more join with `add_worker`).
    store: the weight store versions are published to (default: in memory, zero copy).
    config: `ManagerConfig`.
    clock: time source (wall clock by default; a `ManualClock` in tests and the simulator).
  """

  __slots__ = ("_config", "_clock", "_store", "_core", "_fleet", "_handles", "_hooks", "_weights")

  def __init__(self, workers: Sequence[Worker] = (), store: WeightStore | None = None,
               config: ManagerConfig = ManagerConfig(), clock: Clock = WALL):
    self._config, self._clock = config, clock
    self._store = store if store is not None else MemoryWeightStore()
    self._core = ManagerCore(config, now=clock.now(), store_name=describe_store(self._store))
    self._fleet = self._core.fleet
    self._handles: dict[str, Worker] = {}  # worker id -> handle, of the live workers
    self._hooks: list[TickHook] = []
    self._weights: tuple[Any, Any, Any] | None = None  # being published
    for w in workers:
      self.add_worker(w)

  # ----- read-only -------------------------------------------------------------------------------
  @property
  def config(self) -> ManagerConfig:
    """`ManagerConfig`."""
    return self._config

  @property
  def clock(self) -> Clock:
    """The time source."""
    return self._clock

  @property
  def store(self) -> WeightStore:
    """The weight store versions are published to."""
    return self._store

  @property
  def fleet(self) -> FleetView:
    """The workers and the journals, read-only (`view.FleetView`): worker id -> `WorkerView`,
    `latest`, `cap`, `stats`, `events`, `provenance(request_id)`, `has_commands(worker_id)`."""
    return self._fleet

  @property
  def handles(self) -> Mapping[str, Worker]:
    """Worker id -> the live worker's handle (a read-only mapping, in join order): for tools
    that talk to a worker itself (its engine statistics, a deliberate kill)."""
    return types.MappingProxyType(self._handles)

  @property
  def core(self) -> ManagerCore:
    """The state machine this loop drives (events in, commands and effects out; its state is
    private). An event fed to it directly (a test's late report) has its effects carried out
    by this manager's next call."""
    return self._core

  # ----- the session -----------------------------------------------------------------------------
  def submit(self, requests: Sequence[Request]) -> None:
    """Queues fresh or partial requests (dispatched at the next round)."""
    self._core.submit(requests, self._clock.now())

  def publish(self, params: Any, version: int, moe_state: Any = None, base: Any = None) -> None:
    """Publishes `version` to the store; each worker loads it at its next exchange (once the
    store has committed it) and serves it from then on. With LoRA, `params` are the adapters
    and `base` the `rollout.weights.BaseWeights` they apply to (the store keeps one copy per
    base; a worker loads it once, then adapters only)."""
    self._core.publish(version, self._clock.now())
    self._weights = (params, moe_state, base)
    try:
      self._apply()
    finally:
      self._weights = None

  def add_tick_hook(self, hook: TickHook) -> None:
    """`hook(manager, now)` runs at every tick, before the heartbeats, loads and dispatch
    (trace players, fleets, autoscalers, the offload controller); it changes the manager
    through its commands."""
    self._hooks.append(hook)

  def metrics(self) -> dict:
    """Cumulative counters (`ManagerStats`) plus gauges: live workers, version lag (newest
    published version minus the oldest one a live worker serves), weight loads."""
    return self._core.metrics()

  def describe(self) -> str:
    """A one-paragraph account of the rollout state (for stall errors)."""
    return self._core.describe()

  def snapshot(self) -> list[Request]:
    """Copies of every unfinished request's token state (id order), without stopping anything:
    a checkpoint of the in-flight rollout; resubmitting them resumes exactly."""
    return self._core.snapshot()

  def num_pending(self) -> int:
    """Requests submitted and not yet returned by `poll()` or `abort()`."""
    return self._core.num_pending()

  # ----- the elastic port ------------------------------------------------------------------------
  def add_worker(self, worker: Worker) -> None:
    """A worker joins: it is told to load the newest committed version at its first exchange
    and receives work once it serves a version the requests allow."""
    self._core.add_worker(worker.worker_id, self._clock.now(), local=worker.local,
                          synchronous=worker.synchronous)
    self._handles[worker.worker_id] = worker
    self._apply()

  def remove_worker(self, worker_id: str, reason: str = "removed") -> None:
    """Kills a worker now (e.g. a preemption from a trace): its requests migrate."""
    self._core.on_lost(worker_id, reason, self._clock.now())
    self._apply()

  def retire_worker(self, worker_id: str) -> None:
    """Graceful removal: stop sending work, abort its requests (re-queued with every token kept,
    no attempt counted) and drop it once all are acknowledged."""
    self._core.retire_worker(worker_id, self._clock.now())
    self._apply()

  def evacuate(self, worker_id: str, request_ids: Iterable[int] | None = None,
               target: str | None = None) -> int:
    """Moves requests off a live worker (all when None): abort there, re-queue on the
    acknowledgement (towards `target` if given). Returns how many were asked to move."""
    n = self._core.evacuate(worker_id, request_ids, target, self._clock.now())
    self._apply()
    return n

  def set_accepting(self, worker_id: str, accepting: bool) -> None:
    """Enables / disables dispatch to a worker (e.g. the trainer's seeding engines)."""
    self._core.set_accepting(worker_id, accepting)

  def set_cap(self, n: int | None) -> None:
    """The remote workers wanted (the offload controller's N_prem; None: no cap): a `Fleet`
    starts none beyond it and retires the newest above it."""
    self._core.set_cap(n)

  def worker_times(self) -> dict[str, tuple[float, float, bool]]:
    """Per worker ever seen: `(busy seconds so far, time of its last finished response,
    local)`; busy = holding at least one request (the offload controller's t_remote and
    t_wait_remote come from differences of these over a step)."""
    return self._core.worker_times(self._clock.now())

  def remote_worker_seconds(self) -> float:
    """The integral over time of the number of remote workers, up to now."""
    return self._core.remote_worker_seconds(self._clock.now())

  # ----- the exchange loop ------------------------------------------------------------------------
  def poll(self, min_count: int = 0, timeout: float | None = None) -> list[Completion]:
    """Completions finished since the last call, driving the workers as needed.

    Runs exchange rounds until at least `max(min_count, 1)` completions exist, nothing is left
    in flight, or `timeout` seconds (of the manager's clock) pass; `timeout=0` returns only what
    is already finished.

    Raises:
      RequestFailedError: a request's workers failed more than `config.max_attempts` times
        with an error (preemptions do not count), or a worker rejected it (e.g. longer than
        its context).
      WeightLoadError: the newest weight version cannot be loaded (corrupt, missing, or not
        fitting the model), so the requests waiting for it cannot run.
      RolloutStalledError: requests are pending but cannot progress: no weight version was
        published, there are no workers (and no tick hook that could add one), or nothing
        progressed for `config.stall_timeout` seconds.
    """
    core, clock = self._core, self._clock
    want = max(min_count, 1)
    if timeout is None or timeout > 0:
      deadline = None if timeout is None else clock.now() + timeout
      while core.num_done() < want and core.num_open:
        self._check_progress()
        progressed = self.round()
        core.raise_failures()
        if core.num_done() >= want or not core.num_open:
          break
        now = clock.now()
        if deadline is not None and now >= deadline:
          break
        if not progressed:
          left = self._config.poll_interval if deadline is None else min(
              self._config.poll_interval, deadline - now)
          self._wait(max(left, 0.0))
    core.raise_failures()
    return core.take_completions()

  def _check_progress(self) -> None:
    """Raises `RolloutStalledError` when the pending requests cannot progress."""
    core, n = self._core, self._core.num_open
    if core.fleet.latest < 0:
      raise RolloutStalledError(
          f"poll: {n} requests pending but no weight version was published: call "
          "publish(params, version) before polling")
    if not len(core.fleet) and not self._hooks:
      raise RolloutStalledError(
          f"poll: {n} requests pending and no workers to run them: add_worker(...) first (or a "
          "tick hook such as a Fleet that starts workers)")
    idle = self._clock.now() - core.last_progress
    if idle > self._config.stall_timeout:
      raise RolloutStalledError(
          f"poll: no progress for {idle:.0f} s (ManagerConfig.stall_timeout="
          f"{self._config.stall_timeout:g}) with {n} requests pending: no token, completion, "
          f"weight load or ready worker. State: {core.describe()}")

  def abort(self, request_ids: Iterable[int] | None = None) -> list[Request]:
    """Stops requests (all unfinished when None) and returns their exact partial state.

    Requests on workers are aborted there first and their acknowledgements awaited (a lost
    worker counts as acknowledged), so every token generated before the abort is kept. Already
    finished completions stay available to `poll()`; unknown ids are ignored.
    """
    core, clock = self._core, self._clock
    want, dropped = core.begin_abort(request_ids, clock.now())
    self._apply()
    deadline = clock.now() + self._config.heartbeat_timeout + self._config.startup_timeout
    while core.abort_waiting(want):
      if self.round():
        continue
      if clock.now() > deadline:
        raise RuntimeError(f"abort: no acknowledgement from workers {core.abort_owners(want)}")
      self._wait(self._config.poll_interval)
    return core.end_abort(want, dropped)

  def close(self) -> None:
    """Ends every worker and closes the weight store (waiting for pending writes)."""
    for w in list(self._handles.values()):
      w.kill()
    self._handles.clear()
    self._core.forget_workers()
    self._store.close()

  def round(self) -> bool:
    """One exchange round: send each idle worker its queued commands (with the requests queued
    since the last tick, when a synchronous worker's exchange is due), take ready reports, then
    tick. Returns True when something happened (a report with news, a loss)."""
    core, clock = self._core, self._clock
    self._apply()  # effects of events fed to the core directly
    # Requests queued since the last tick join a synchronous worker's exchange (its step).
    progressed = core.dispatch_due(clock.now())
    for wid, commands in core.outbox():
      self._handles[wid].send(commands)
      core.on_sent(wid, clock.now())
    # Every exchange is sent before any is received: in-process workers on threads of their own
    # (`ThreadWorker`) compute side by side, and their reports are still taken in worker order.
    for wid in core.outstanding():
      worker = self._handles.get(wid)
      if worker is None:
        continue
      try:
        rep = worker.receive()
      except WorkerLost as e:
        core.on_lost(wid, str(e), clock.now())
        self._apply()
        progressed = True
        continue
      if rep is not None:
        progressed |= core.on_report(rep, clock.now())
        self._apply()
    return self._tick() or progressed

  def _tick(self) -> bool:
    """Tick hooks, then the state machine's tick (heartbeats, weight loads, dispatch, load
    balancing) at the clock's time."""
    core = self._core
    now = self._clock.now()
    core.begin_tick(now)
    for hook in self._hooks:
      hook(self, now)
    awaited = core.awaiting_commit()
    if awaited is not None:
      ref = self._store.published(awaited[0])
      if ref is not None:
        core.on_committed(ref)
      elif awaited[1]:
        self._store.check()  # a failed write raises, never stalls
    changed = core.tick(now)
    self._apply()
    return changed

  def _apply(self) -> None:
    """Carries out the state machine's effects, in order."""
    for effect in self._core.take_effects():
      if isinstance(effect, Kill):
        worker = self._handles.pop(effect.worker_id, None)
        if worker is not None:
          worker.kill()
      elif isinstance(effect, Release):
        self._handles.pop(effect.worker_id, None)
      elif isinstance(effect, CollectGarbage):
        self._store.gc(effect.in_use)
      elif isinstance(effect, Publish):
        if self._weights is None:
          raise RuntimeError(f"weight version {effect.version} has no weights to publish")
        params, moe_state, base = self._weights
        if base is None:
          self._store.publish(params, effect.version, moe_state)
        else:
          self._store.publish(params, effect.version, moe_state, base=base)

  def _wait(self, seconds: float) -> None:
    outstanding = [self._handles[w] for w in self._core.outstanding() if w in self._handles]
    if not outstanding:
      # A synchronous worker with an exchange due (a load or requests this round's tick queued
      # after the workers' turn) is served by the next round at once: waiting would only
      # delay it (the trainer's in-process rollout paid poll_interval on every step).
      if not self._core.exchange_due():
        self._clock.sleep(seconds)
      return
    by_cls: dict[type, list] = collections.defaultdict(list)
    for w in outstanding:
      by_cls[type(w)].append(w)
    for cls, ws in by_cls.items():
      cls.wait_any(ws, seconds / len(by_cls), self._clock)

"""The rollout manager: every request's token-level state, routed over workers that come and go.

`RolloutManager` implements `RolloutClient` towards the trainer's loop and is a deterministic,
event-driven state machine towards its workers. It holds each unfinished request (prompt,
tokens so far, their logprobs and per-token weight versions) as the single source of truth and
reacts to events:

- `submit(requests)`: queue them;
- `on_report(report)`: a worker's chunks extend their requests (only from the request's owner and
  only at `TokenChunk.start == tokens so far`: late or duplicated chunks are ignored), finished
  requests become completions, abort acknowledgements re-queue requests;
- `add_worker(worker)` / `on_lost(worker_id)`: a joining worker is told to pull the newest
  weights; a lost one's requests are re-queued at the front as prompt + tokens so far with the
  remaining budget (token-level migration: one prefill elsewhere, no decode work lost, and the
  same per-request randomness, so the final response equals the undisturbed one);
- `publish(params, version)`: the version goes to the weight store; workers pull it;
- `tick()`: heartbeats, weight pulls, dispatch (`balance.select_worker`), continuous load
  balancing (`balance.pending_moves` / `running_moves`), tick hooks (trace players, autoscalers).

Two classes, one holding the other: `core.ManagerCore` is the state machine (the events above,
no I/O); `RolloutManager` holds one as `core` and adds the exchange loop (`round`, `poll`,
`abort`), forwarding the state machine's events and views. Time comes only from the injected
`Clock`; workers only through the `Worker` interface. `poll()` drives exchanges until enough
completions exist, which is all the I/O there is, so the same code runs over an in-process
engine, Ray actors, or the simulator's virtual workers.
"""
from __future__ import annotations

import collections
import functools
from typing import Iterable, Sequence

from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.manager.config import ManagerConfig, RolloutStalledError
from jaxrl_sys.rollout.manager.core import ManagerCore
from jaxrl_sys.rollout.types import Completion, Request
from jaxrl_sys.rollout.weights.base import WeightStore
from jaxrl_sys.rollout.workers.protocol import Worker, WorkerLost


def _method(name: str):
  """A method of `RolloutManager` that calls the state machine's method `name`."""
  real = getattr(ManagerCore, name)

  @functools.wraps(real)
  def call(self, *args, **kwargs):
    return getattr(self.core, name)(*args, **kwargs)

  return call


def _field(name: str, doc: str):
  """An attribute of `RolloutManager` that reads (and writes) the state machine's `name`."""
  return property(lambda self: getattr(self.core, name),
                  lambda self, value: setattr(self.core, name, value), doc=doc)


class RolloutManager:
  """Routes requests over workers; implements `rollout.types.RolloutClient`.

  Args:
    workers: initial workers (more join with `add_worker`).
    store: the weight store versions are published to (default: in memory, zero copy).
    config: `ManagerConfig`.
    clock: time source (wall clock by default; a `ManualClock` in tests and the simulator).
  """

  def __init__(self, workers: Sequence[Worker] = (), store: WeightStore | None = None,
               config: ManagerConfig = ManagerConfig(), clock: Clock = WALL):
    self.core = ManagerCore(workers, store, config, clock)

  # ----- the state machine's events and views ---------------------------------------------------
  submit = _method("submit")
  publish = _method("publish")
  add_worker = _method("add_worker")
  on_lost = _method("on_lost")
  remove_worker = _method("remove_worker")
  retire_worker = _method("retire_worker")
  evacuate = _method("evacuate")
  set_accepting = _method("set_accepting")
  add_tick_hook = _method("add_tick_hook")
  on_report = _method("on_report")
  tick = _method("tick")
  loads = _method("loads")
  metrics = _method("metrics")
  remote_worker_seconds = _method("remote_worker_seconds")
  worker_times = _method("worker_times")
  describe = _method("describe")
  snapshot = _method("snapshot")
  provenance = _method("provenance")
  config = _field("config", "`ManagerConfig`.")
  clock = _field("clock", "The time source.")
  store = _field("store", "The weight store.")
  workers = _field("workers", "worker id -> `state.WorkerState` of every live worker.")
  requests = _field("requests", "request id -> `state.ReqState` of every request not returned.")
  queue = _field("queue", "Ids of requests waiting for dispatch, in order.")
  latest = _field("latest", "The newest published weight version (-1: none).")
  stats = _field("stats", "`state.ManagerStats`, cumulative counters.")
  events = _field("events", "`(time, kind, worker, detail)` log of joins, losses, pulls, moves.")
  worker_cap = _field("worker_cap", "Remote workers wanted (the offload controller's N_prem).")
  busy_of_gone = _field("busy_of_gone", "Busy times of lost or retired workers.")

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
      WeightPullError: the newest weight version cannot be loaded (corrupt, missing, or not
        fitting the model), so the requests waiting for it cannot run.
      RolloutStalledError: requests are pending but cannot progress: no weight version was
        published, there are no workers (and no tick hook that could add one), or nothing
        progressed for `config.stall_timeout` seconds.
    """
    core = self.core
    want = max(min_count, 1)
    if timeout is None or timeout > 0:
      deadline = None if timeout is None else self.clock.now() + timeout
      while core.num_done() < want and core.num_open:
        self._check_progress()
        progressed = self.round()
        core.raise_failures()
        if core.num_done() >= want or not core.num_open:
          break
        now = self.clock.now()
        if deadline is not None and now >= deadline:
          break
        if not progressed:
          left = self.config.poll_interval if deadline is None else min(
              self.config.poll_interval, deadline - now)
          self._wait(max(left, 0.0))
    core.raise_failures()
    return core.take_completions()

  def _check_progress(self) -> None:
    """Raises `RolloutStalledError` when the pending requests cannot progress."""
    core, n = self.core, self.core.num_open
    if core.latest < 0:
      raise RolloutStalledError(
          f"poll: {n} requests pending but no weight version was published: call "
          "publish(params, version) before polling")
    if not core.workers and not core.has_hooks():
      raise RolloutStalledError(
          f"poll: {n} requests pending and no workers to run them: add_worker(...) first (or a "
          "tick hook such as a Fleet that starts workers)")
    idle = self.clock.now() - core.last_progress
    if idle > self.config.stall_timeout:
      raise RolloutStalledError(
          f"poll: no progress for {idle:.0f} s (ManagerConfig.stall_timeout="
          f"{self.config.stall_timeout:g}) with {n} requests pending: no token, completion, "
          f"weight pull or ready worker. State: {core.describe()}")

  def abort(self, request_ids: Iterable[int] | None = None) -> list[Request]:
    """Stops requests (all unfinished when None) and returns their exact partial state.

    Requests on workers are aborted there first and their acknowledgements awaited (a lost
    worker counts as acknowledged), so every token generated before the abort is kept. Already
    finished completions stay available to `poll()`; unknown ids are ignored.
    """
    core, requests = self.core, self.requests
    want = [rid for rid, st in requests.items() if not st.done] if request_ids is None else [
        int(r) for r in request_ids if int(r) in requests and not requests[int(r)].done]
    out: list[Request] = []
    queued = set(core.queue)
    for rid in want:
      st = requests[rid]
      if rid in queued:
        out.append(core.drop(rid))
      else:
        st.aborting = True
        core.abort_on_owner(st)
    deadline = self.clock.now() + self.config.heartbeat_timeout + self.config.startup_timeout
    while any(requests[r].owner is not None for r in want
              if r in requests and requests[r].aborting):
      if self.round():
        continue
      if self.clock.now() > deadline:
        owners = sorted({str(requests[r].owner) for r in want if r in requests})
        raise RuntimeError(f"abort: no acknowledgement from workers {owners}")
      self._wait(self.config.poll_interval)
    for rid in want:
      st = requests.get(rid)
      if st is not None and st.aborting and not st.done:
        if rid in core.queue:
          core.queue.remove(rid)
        out.append(core.drop(rid))
    self.stats.aborted += len(out)
    return sorted(out, key=lambda r: r.request_id)

  def num_pending(self) -> int:
    """Requests submitted and not yet returned by `poll()` or `abort()`."""
    return len(self.requests)

  def close(self) -> None:
    """Ends every worker and closes the weight store (waiting for pending writes)."""
    for ws in list(self.workers.values()):
      ws.worker.kill()
    self.workers.clear()
    self.store.close()

  def round(self) -> bool:
    """One exchange round: send each idle worker its queued commands, take ready reports, then
    tick. Returns True when something happened (a report with news, a loss)."""
    core, workers = self.core, self.workers
    progressed = False
    for ws in list(workers.values()):
      if not ws.outstanding and (ws.should_exchange() or not ws.worker.synchronous):
        ws.worker.send(ws.take_commands())
        ws.outstanding, ws.sent_at = True, self.clock.now()
    # Every exchange is sent before any is received: in-process workers on threads of their own
    # (`ThreadWorker`) compute side by side, and their reports are still taken in worker order.
    for ws in list(workers.values()):
      if not ws.outstanding or workers.get(ws.worker.worker_id) is not ws:
        continue
      try:
        rep = ws.worker.receive()
      except WorkerLost as e:
        core.on_lost(ws.worker.worker_id, str(e))
        progressed = True
        continue
      if rep is not None:
        ws.outstanding = False
        progressed |= core.on_report(rep)
    progressed |= core.tick()
    return progressed

  def _wait(self, seconds: float) -> None:
    outstanding = [ws.worker for ws in self.workers.values() if ws.outstanding]
    if not outstanding:
      # A synchronous worker with an exchange due (a pull or requests this round's tick queued
      # after the workers' turn) is served by the next round at once: waiting would only
      # delay it (the trainer's in-process rollout paid poll_interval on every step).
      if not any(ws.worker.synchronous and ws.should_exchange() for ws in self.workers.values()):
        self.clock.sleep(seconds)
      return
    by_cls: dict[type, list] = collections.defaultdict(list)
    for w in outstanding:
      by_cls[type(w)].append(w)
    for cls, ws in by_cls.items():
      cls.wait_any(ws, seconds / len(by_cls), self.clock)

"""The rollout manager's bookkeeping records (plain data).

`ReqState` is one request's manager-side state (the token state itself is its `Request`);
`WorkerState` is the manager's view of one worker, updated from its reports; `ManagerStats`
are cumulative counters (the loop reports their per-step differences); `Ledger` holds what the
core and its worker table write for others to read (counters, events, provenance, errors for
the next `poll`, effects for the exchange loop); `Kill`, `Release`, `Publish` and
`CollectGarbage` are the effects the exchange loop carries out. All of it is private to
`manager/`: outside it, `view.FleetView` reads it.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Union

import numpy as np

from jaxrl_sys.rollout.manager import balance
from jaxrl_sys.rollout.types import Request
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerReport


@dataclasses.dataclass
class ManagerStats:
  """Cumulative counters. `migrated`: requests re-queued after a worker loss; `tokens_kept`:
  tokens those requests carried (decode work not redone), `tokens_discarded` those an ablation
  threw away; `balanced`: requests moved between
  live workers by the balancer or an evacuation; `tokens_local`: tokens from workers on the
  trainer's devices; `load_seconds`: each completed weight load."""
  submitted: int = 0
  completed: int = 0
  aborted: int = 0
  tokens: int = 0
  tokens_local: int = 0
  migrated: int = 0
  tokens_kept: int = 0
  tokens_discarded: int = 0
  balanced: int = 0
  joined: int = 0
  lost: int = 0
  ignored_chunks: int = 0
  ignored_reports: int = 0
  load_seconds: list = dataclasses.field(default_factory=list)

  def counters(self) -> dict[str, int]:
    return {k: v for k, v in dataclasses.asdict(self).items() if isinstance(v, int)}


@dataclasses.dataclass
class ReqState:
  """One request in the manager.

  Attributes:
    request: the token state (prompt, tokens so far, logprobs, versions): the source of truth.
    submitted_at: clock time of submission.
    owner: the worker it is assigned to, or None while queued.
    target: a worker the balancer moves it to (dispatch prefers it while it qualifies).
    attempts: worker failures (errors) it went through while held (its failure budget).
    preempted: worker preemptions it went through (never counted against it).
    done: finished (a completion waits for `poll`).
    moving: an abort was sent to move it; re-queued on the acknowledgement.
    aborting: `abort()` wants it back; returned on the acknowledgement.
  """
  request: Request
  submitted_at: float = 0.0
  owner: str | None = None
  target: str | None = None
  attempts: int = 0
  preempted: int = 0
  done: bool = False
  moving: bool = False
  aborting: bool = False


class WorkerState:
  """The manager's view of one worker, updated from its reports (the worker's handle stays with
  the exchange loop: the state machine never calls a worker)."""

  def __init__(self, worker_id: str, joined_at: float, *, local: bool, synchronous: bool):
    self.worker_id = worker_id
    self.local, self.synchronous = bool(local), bool(synchronous)
    self.joined_at = joined_at
    self.version = -1          # serving
    self.loading = -1          # being loaded (worker's view)
    self.load_sent = -1        # newest version it was told to load
    self.load_sent_at = joined_at
    self.num_slots = 0
    self.running: set[int] = set()
    self.waiting: list[int] = []
    self.assigned: dict[int, None] = {}  # ids it holds, in assignment order
    self.commands = Commands()
    self.outstanding = False
    self.sent_at = joined_at
    self.last_heard = joined_at
    self.pid = 0
    self.failed_loads = 0
    self.busy_since: float | None = None
    self.busy_total = 0.0
    self.last_done = joined_at
    self.retiring = False
    self.disabled = False
    self._profile: collections.deque = collections.deque()
    self._plateau: int | None = None
    self._plateau_dirty = False

  def accepting(self) -> bool:
    return self.version >= 0 and not self.retiring and not self.disabled

  def should_exchange(self) -> bool:
    """An exchange is due: commands to send, or requests held that are still generating."""
    return not self.commands.empty() or bool(self.assigned)

  def take_commands(self) -> Commands:
    c, self.commands = self.commands, Commands()
    return c

  def assign(self, request_id: int, now: float) -> None:
    if not self.assigned:
      self.busy_since = now
    self.assigned[request_id] = None

  def release(self, request_id: int, now: float) -> None:
    """The worker no longer holds `request_id` (finished, acknowledged, withdrawn)."""
    if self.assigned.pop(request_id, 0) is None and not self.assigned:
      self.close_busy(now)

  def close_busy(self, now: float) -> None:
    if self.busy_since is not None:
      self.busy_total += now - self.busy_since
      self.busy_since = None

  def busy_now(self, now: float) -> float:
    return self.busy_total + (0.0 if self.busy_since is None else now - self.busy_since)

  def unsend(self, request_id: int) -> bool:
    """Removes a submit not yet sent; True if it was there."""
    subs = self.commands.submit
    for i, r in enumerate(subs):
      if r.request_id == request_id:
        del subs[i]
        return True
    return False

  def observe(self, rep: WorkerReport, now: float, window: int) -> None:
    self.version, self.loading, self.num_slots = rep.version, rep.loading, rep.num_slots
    self.running, self.waiting = set(rep.running), list(rep.waiting)
    self.last_heard, self.pid = now, rep.pid
    if len(rep.profile):
      self._profile.extend(map(tuple, np.asarray(rep.profile).reshape(-1, 3)))
      while len(self._profile) > window:
        self._profile.popleft()
      self._plateau_dirty = True

  def profile_array(self) -> np.ndarray:
    return np.asarray(self._profile, np.float64).reshape(-1, 3)

  def plateau(self, frac: float) -> int | None:
    if self._plateau_dirty:
      self._plateau = balance.plateau_batch(self.profile_array(), frac)
      self._plateau_dirty = False
    return self._plateau


@dataclasses.dataclass(frozen=True)
class Kill:
  """Effect: stop worker `worker_id` now (lost, removed or silent: no zombie) and forget it."""
  worker_id: str


@dataclasses.dataclass(frozen=True)
class Release:
  """Effect: forget worker `worker_id`'s handle (retired gracefully: nothing to stop)."""
  worker_id: str


@dataclasses.dataclass(frozen=True)
class Publish:
  """Effect: write the weights being published to the store as `version`."""
  version: int


@dataclasses.dataclass(frozen=True)
class CollectGarbage:
  """Effect: `store.gc(in_use)`, the versions live workers serve or load."""
  in_use: frozenset


Effect = Union[Kill, Release, Publish, CollectGarbage]


@dataclasses.dataclass
class Ledger:
  """What the core and its worker table write for others to read.

  Attributes:
    stats: cumulative counters.
    events: `(time, kind, worker, detail)` log of joins, losses, loads, moves.
    provenance: request id -> `(worker_id, start, end)` token ranges, in production order.
    failures: errors the next `poll` raises (the first one).
    effects: what the exchange loop must carry out, in order.
  """
  stats: ManagerStats = dataclasses.field(default_factory=ManagerStats)
  events: list = dataclasses.field(default_factory=list)
  provenance: dict = dataclasses.field(default_factory=dict)
  failures: list = dataclasses.field(default_factory=list)
  effects: list = dataclasses.field(default_factory=list)

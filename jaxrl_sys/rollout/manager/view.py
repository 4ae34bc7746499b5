"""What the rollout manager shows outside `manager/`: `FleetView` (the workers and the
journals, read-only), `WorkerView` (one worker, read-only) and `ElasticPort` (what `elastic/`
and the simulator drive: the view plus the fleet commands; `RolloutManager` implements it, and
a tick hook receives it).

`TableView` is the `FleetView` of the manager's `fleet.WorkerTable` and `state.Ledger`: every
answer is a read-only record or a copy, and setting an attribute raises, so nothing outside
`manager/` can change the state the core reasons about except through the manager's commands.
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Callable, Iterable, Iterator, Protocol

from jaxrl_sys.rollout.clock import Clock
from jaxrl_sys.rollout.manager.fleet import WorkerTable
from jaxrl_sys.rollout.manager.state import Ledger, ManagerStats, WorkerState
from jaxrl_sys.rollout.workers.protocol import Worker


def _read_only(self, name: str, value: Any) -> None:
  raise AttributeError(f"{type(self).__name__} is read-only (tried to set {name!r}): change the "
                       "manager through its commands (add_worker, set_accepting, set_cap, ...)")


class WorkerView:
  """One live worker as the manager sees it (read-only: a live view of the manager's record;
  collections come back as copies, and setting an attribute raises).

  Attributes:
    worker_id: the worker.
    local: on the trainer's devices (a seeding engine) rather than remote.
    synchronous: its `receive()` runs the exchange (in-process engines).
    version: weight version it serves (-1: none yet); loading: version it loads (-1: none).
    assigned: request ids it holds, in assignment order (a tuple).
    running: the ones in its decode slots (a frozenset); waiting: accepted there, not started.
    num_slots: its decode slots.
    accepting: serving weights and neither retiring nor disabled (dispatch sends it work).
    retiring: being removed gracefully.
    outstanding: an exchange with it is in flight.
    has_commands: commands wait for its next exchange.
    joined_at, last_heard: clock times of its join and of its last report.
  """

  __slots__ = ("_ws",)
  __setattr__ = _read_only

  def __init__(self, ws: WorkerState):
    object.__setattr__(self, "_ws", ws)

  worker_id = property(lambda self: self._ws.worker_id)
  local = property(lambda self: self._ws.local)
  synchronous = property(lambda self: self._ws.synchronous)
  version = property(lambda self: self._ws.version)
  loading = property(lambda self: self._ws.loading)
  assigned = property(lambda self: tuple(self._ws.assigned))
  running = property(lambda self: frozenset(self._ws.running))
  waiting = property(lambda self: tuple(self._ws.waiting))
  num_slots = property(lambda self: self._ws.num_slots)
  accepting = property(lambda self: self._ws.accepting())
  retiring = property(lambda self: self._ws.retiring)
  outstanding = property(lambda self: self._ws.outstanding)
  has_commands = property(lambda self: not self._ws.commands.empty())
  joined_at = property(lambda self: self._ws.joined_at)
  last_heard = property(lambda self: self._ws.last_heard)

  def __repr__(self) -> str:
    return (f"WorkerView({self.worker_id!r}, v{self.version}, holds {len(self._ws.assigned)}, "
            f"{'local' if self.local else 'remote'})")


class FleetView(Protocol):
  """The manager's state as `elastic/`, `sim/` and tools read it: a read-only mapping of live
  worker id -> `WorkerView` (join order) and the manager's journals. Answers are read-only
  records or copies: the manager's state changes only through its commands.

  Attributes:
    latest: the newest published weight version (-1: none).
    cap: the remote workers wanted (the offload controller's N_prem; None: no cap), set by
      the manager's `set_cap` command.
    stats: a copy of the cumulative counters (`state.ManagerStats`).
    events: the `(time, kind, worker, detail)` log so far (joins, losses, loads, moves).
  """
  latest: int
  cap: int | None
  stats: ManagerStats
  events: tuple[tuple[float, str, str, str], ...]

  def __getitem__(self, worker_id: str) -> WorkerView: ...

  def __contains__(self, worker_id: object) -> bool: ...

  def __iter__(self) -> Iterator[str]: ...

  def __len__(self) -> int: ...

  def get(self, worker_id: str, default: Any = None) -> WorkerView | None: ...

  def keys(self) -> collections.abc.KeysView: ...

  def values(self) -> list[WorkerView]: ...

  def items(self) -> list[tuple[str, WorkerView]]: ...

  def has_commands(self, worker_id: str) -> bool:
    """Whether commands wait for `worker_id`'s next exchange (False for unknown workers)."""

  def outstanding(self) -> list[str]:
    """The workers with an exchange in flight, in join order."""

  def provenance(self, request_id: int) -> list[tuple[str, int, int]]:
    """`(worker_id, start, end)` token ranges of a request, in the order they were produced."""


class ElasticPort(Protocol):
  """What `elastic/` (the `Fleet`, the offload controller) and the simulator drive: the
  manager's read-only `fleet`, its clock, and its fleet commands. `RolloutManager` implements
  it; a tick hook receives it."""

  @property
  def fleet(self) -> FleetView: ...

  @property
  def clock(self) -> Clock: ...

  def add_worker(self, worker: Worker) -> None: ...

  def remove_worker(self, worker_id: str, reason: str = "removed") -> None: ...

  def retire_worker(self, worker_id: str) -> None: ...

  def set_accepting(self, worker_id: str, accepting: bool) -> None: ...

  def evacuate(self, worker_id: str, request_ids: Iterable[int] | None = None,
               target: str | None = None) -> int: ...

  def set_cap(self, n: int | None) -> None: ...

  def worker_times(self) -> dict[str, tuple[float, float, bool]]: ...

  def remote_worker_seconds(self) -> float: ...

  def add_tick_hook(self, hook: Callable[[Any, float], None]) -> None: ...

  def describe(self) -> str: ...


class TableView(collections.abc.Mapping):
  """The `FleetView` of a `WorkerTable` and its ledger (read-only; see `FleetView`)."""

  __slots__ = ("_table", "_ws", "_ledger")

  def __init__(self, table: WorkerTable, ledger: Ledger):
    object.__setattr__(self, "_table", table)
    object.__setattr__(self, "_ws", table.records)  # read here, written only by the table
    object.__setattr__(self, "_ledger", ledger)

  __setattr__ = _read_only

  def __getitem__(self, worker_id: str) -> WorkerView:
    return WorkerView(self._ws[worker_id])

  def __contains__(self, worker_id: object) -> bool:
    return worker_id in self._ws

  def __iter__(self) -> Iterator[str]:
    return iter(list(self._ws))

  def __len__(self) -> int:
    return len(self._ws)

  def values(self) -> list[WorkerView]:  # type: ignore[override]
    return [WorkerView(ws) for ws in self._ws.values()]

  def items(self) -> list[tuple[str, WorkerView]]:  # type: ignore[override]
    return [(w, WorkerView(ws)) for w, ws in self._ws.items()]

  @property
  def latest(self) -> int:
    return self._table.latest

  @property
  def cap(self) -> int | None:
    return self._table.cap

  @property
  def stats(self) -> ManagerStats:
    s = self._ledger.stats
    return dataclasses.replace(s, load_seconds=list(s.load_seconds))

  @property
  def events(self) -> tuple[tuple[float, str, str, str], ...]:
    return tuple(self._ledger.events)

  def has_commands(self, worker_id: str) -> bool:
    ws = self._ws.get(worker_id)
    return ws is not None and not ws.commands.empty()

  def outstanding(self) -> list[str]:
    return self._table.outstanding()

  def provenance(self, request_id: int) -> list[tuple[str, int, int]]:
    return list(self._ledger.provenance.get(request_id, ()))

"""Spot-availability traces: parsing, statistics and transformations.

A `Trace` is a time-sorted list of `TraceEvent(t, "add" | "remove", node)` (t in seconds from
the trace start) and an `end` (seconds). Node ids are strings; an id may come back after a
remove. Files (the shipped ones are in `jaxrl_sys/data/traces/`, see its README; loaders in
`rollout.elastic.trace_formats`):

- Bamboo event logs (`load_bamboo`): CSV lines `<ms>,<add|remove>,<node>`, CRLF or LF.
  `end` = the last event's time.
- Parcae segments (`load_parcae`): JSON lines `[ms, "add"|"remove"|"no-op", {"nodes": [...],
  "duration": ms, ...}]`; `end` = the last line's time + its duration (60 lines x 60 s = 1 h).
  The file name's `<a>_<b>` is the window of the Bamboo p3 trace, in tenths of an hour for
  `hh_55_65`, `hl_15_25`, `lh_80_90` (their minute-by-minute live counts equal those of
  `p3.segment(0.1 a h, 0.1 b h)`) but in whole hours for `ll_10_11` (hours 10-11 of p3; the
  tenths reading, hours 1.0-1.1, does not match).

Statistics conventions: `live_at(t)` counts nodes after every event at time <= t;
`mean_live(start, end)` is time-weighted over [start, end] (default [0, end]). The README's
means (p3 24.0, g4dn 12.8) are over the span from the first to the last event:
`trace.mean_live(trace.first_time, trace.last_time)`; for p3 (first event at 0) that equals
the default, for g4dn (first event at 480 s) the default gives 12.6.

Replaying a trace against a clock, and random kills: `rollout.schedules`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

ADD, REMOVE = "add", "remove"


@dataclasses.dataclass(frozen=True)
class TraceEvent:
  """One availability change: node `node` appears ("add") or vanishes ("remove") at `t` s."""
  t: float
  kind: str
  node: str

  def __post_init__(self):
    if self.kind not in (ADD, REMOVE):
      raise ValueError(f"TraceEvent kind must be 'add' or 'remove', got {self.kind!r}")
    if not (math.isfinite(self.t) and self.t >= 0):
      raise ValueError(f"TraceEvent time must be finite and >= 0, got {self.t}")


@dataclasses.dataclass(frozen=True)
class TraceCounts:
  """Event counts: events, adds, removes, distinct node ids, distinct timestamps."""
  events: int
  adds: int
  removes: int
  ids: int
  timestamps: int


def check_events(events: Iterable[TraceEvent], where=lambda i: f"event {i}") -> None:
  """Raises ValueError (naming `where(i)`) on a time going back, an add of a live node or a
  remove of a node that is not live."""
  live, last = set(), 0.0
  for i, e in enumerate(events):
    if e.t < last:
      raise ValueError(f"{where(i)}: time goes backwards ({e.t} s after {last} s)")
    last = e.t
    if e.kind == ADD:
      if e.node in live:
        raise ValueError(f"{where(i)}: add of node {e.node!r}, which is already live")
      live.add(e.node)
    else:
      if e.node not in live:
        raise ValueError(f"{where(i)}: remove of node {e.node!r}, which is not live")
      live.remove(e.node)


@dataclasses.dataclass(frozen=True)
class Trace:
  """Availability of preemptible nodes over [0, end] seconds.

  Attributes:
    events: events in time order (a stable sort of what was given: ties keep their order).
    end: seconds the trace spans (>= the last event's time).
    name: a label (the file name for loaded traces).
  """
  events: tuple[TraceEvent, ...]
  end: float
  name: str = ""
  _times: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
  _live: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    events = tuple(sorted(self.events, key=lambda e: e.t))
    check_events(events, lambda i: f"trace {self.name or '<unnamed>'}: event {i}")
    if events and self.end < events[-1].t:
      raise ValueError(f"trace end {self.end} s is before its last event ({events[-1].t} s)")
    times, live, n = [], [], 0
    for e in events:
      n += 1 if e.kind == ADD else -1
      if times and times[-1] == e.t:
        live[-1] = n
      else:
        times.append(e.t)
        live.append(n)
    object.__setattr__(self, "events", events)
    object.__setattr__(self, "end", float(self.end))
    object.__setattr__(self, "_times", np.asarray(times, np.float64))
    object.__setattr__(self, "_live", np.asarray(live, np.int64))

  @property
  def first_time(self) -> float:
    """Seconds of the first event (0 for an empty trace)."""
    return self.events[0].t if self.events else 0.0

  @property
  def last_time(self) -> float:
    """Seconds of the last event (0 for an empty trace)."""
    return self.events[-1].t if self.events else 0.0

  @property
  def nodes(self) -> tuple[str, ...]:
    """Distinct node ids in order of first appearance."""
    return tuple(dict.fromkeys(e.node for e in self.events))

  def live_at(self, t: float) -> int:
    """Nodes live after every event at time <= t (seconds)."""
    i = np.searchsorted(self._times, t, side="right") - 1
    return int(self._live[i]) if i >= 0 else 0

  def live_nodes_at(self, t: float) -> frozenset[str]:
    """Ids of the nodes live after every event at time <= t (seconds)."""
    live = set()
    for e in self.events:
      if e.t > t:
        break
      (live.add if e.kind == ADD else live.discard)(e.node)
    return frozenset(live)

  def max_live(self) -> int:
    """Most nodes live at once."""
    return int(self._live.max()) if len(self._live) else 0

  def live_integral(self, start: float = 0.0, end: float | None = None) -> float:
    """Node-seconds over [start, end] (default [0, self.end]): the integral of `live_at`."""
    end = self.end if end is None else end
    if end < start:
      raise ValueError(f"live_integral: end {end} < start {start}")
    edges = np.concatenate([[start], self._times[(self._times > start) & (self._times < end)],
                            [end]])
    counts = np.array([self.live_at(t) for t in edges[:-1]], np.float64)
    return float(np.sum(counts * np.diff(edges)))

  def mean_live(self, start: float = 0.0, end: float | None = None) -> float:
    """Time-weighted mean live count over [start, end] (default [0, self.end]); see the module
    docstring for the span the shared README uses."""
    end = self.end if end is None else end
    if end == start:
      return float(self.live_at(start))
    return self.live_integral(start, end) / (end - start)

  def counts(self) -> TraceCounts:
    """Numbers of events, adds, removes, distinct node ids and distinct timestamps."""
    adds = sum(e.kind == ADD for e in self.events)
    return TraceCounts(len(self.events), adds, len(self.events) - adds, len(self.nodes),
                       len(self._times))

  def live_series(self, step: float, start: float = 0.0,
                  end: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`(times, live)` at start, start + step, ... <= end (default self.end); float64 seconds
    and int64 counts, shape `[n]`."""
    end = self.end if end is None else end
    if step <= 0:
      raise ValueError(f"live_series: step must be > 0, got {step}")
    n = int(math.floor((end - start) / step + 1e-9)) + 1
    times = start + step * np.arange(max(n, 0), dtype=np.float64)
    i = np.searchsorted(self._times, times, side="right") - 1
    live = np.where(i >= 0, self._live[np.maximum(i, 0)], 0) if len(self._live) else \
        np.zeros(len(times), np.int64)
    return times, live.astype(np.int64)

  def segment(self, start: float, end: float, name: str | None = None) -> Trace:
    """The window [start, end) as a trace of `end - start` seconds: nodes live at `start` are
    adds at 0 (in order of arrival), later events in the window shift by -start."""
    if not 0 <= start < end:
      raise ValueError(f"segment: need 0 <= start < end, got [{start}, {end})")
    live = self.live_nodes_at(start)
    order = [n for n in self.nodes if n in live]
    ev = [TraceEvent(0.0, ADD, n) for n in order]
    ev += [TraceEvent(e.t - start, e.kind, e.node) for e in self.events if start < e.t < end]
    return Trace(tuple(ev), end - start, name or f"{self.name}[{start:g}:{end:g}]")

  def sample(self, fraction: float, seed: int = 0) -> Trace:
    """A seeded random `round(fraction * ids)` of the node ids, each with its whole add/remove
    history (RLBoost kept 50% of Bamboo's instances this way). Same seed, same subset."""
    if not 0 <= fraction <= 1:
      raise ValueError(f"sample: fraction must be in [0, 1], got {fraction}")
    ids = self.nodes
    k = int(round(fraction * len(ids)))
    keep = {ids[i] for i in np.random.default_rng(seed).choice(len(ids), k, replace=False)}
    return Trace(tuple(e for e in self.events if e.node in keep), self.end,
                 f"{self.name}~{fraction:g}@{seed}")

  def scale_time(self, factor: float) -> Trace:
    """Every time (and `end`) multiplied by `factor` (finite, > 0)."""
    if not (factor > 0 and math.isfinite(factor)):
      raise ValueError(f"scale_time: factor must be a finite number > 0, got {factor}")
    return Trace(tuple(TraceEvent(e.t * factor, e.kind, e.node) for e in self.events),
                 self.end * factor, f"{self.name}x{factor:g}")

  def cap(self, n: int) -> Trace:
    """The nodes a replayer uses when it runs at most `n` at once: an arriving node is used if
    fewer than `n` are in use; when a used node is removed, the longest-waiting live unused
    node (if any) replaces it at the same time (RLBoost's replay with the N_prem cap)."""
    if n < 0:
      raise ValueError(f"cap: n must be >= 0, got {n}")
    used, waiting, out = set(), {}, []
    for e in self.events:
      if e.kind == ADD:
        if len(used) < n:
          used.add(e.node)
          out.append(e)
        else:
          waiting[e.node] = None
      elif e.node in used:
        used.remove(e.node)
        out.append(e)
        if waiting:
          node = next(iter(waiting))
          del waiting[node]
          used.add(node)
          out.append(TraceEvent(e.t, ADD, node))
      else:
        del waiting[e.node]
    return Trace(tuple(out), self.end, f"{self.name}<={n}")


def constant_trace(n: int, duration: float, name: str | None = None) -> Trace:
  """`n` nodes ("node-0", ...) added at 0 and never removed, over `duration` seconds."""
  if n < 0 or duration < 0:
    raise ValueError(f"constant_trace: need n >= 0 and duration >= 0, got {n}, {duration}")
  return Trace(tuple(TraceEvent(0.0, ADD, f"node-{i}") for i in range(n)), duration,
               name or f"constant{n}")

"""Preemption schedules replayed against an injected clock: pure, no processes.

`TracePlayer(trace, time_scale).due(now)` and `ChaosSchedule(kill_every, seed, restart_after,
slots).due(now)` return the `TraceEvent`s whose time has come since the previous call; a host
loop (`rollout.elastic.fleet.Fleet`) kills and starts workers accordingly, the simulator feeds them
virtual time.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from jaxrl_sys.rollout.elastic.traces import ADD, REMOVE, Trace, TraceEvent


class TracePlayer:
  """Replays a trace against a host clock: event time t fires at `origin + t * time_scale`.

  `due(now)` returns the trace's events (trace times, not host times) that fired since the
  previous call, each exactly once and in order; `now` must not decrease.
  """

  def __init__(self, trace: Trace, time_scale: float = 1.0, origin: float = 0.0):
    if not (time_scale > 0 and math.isfinite(time_scale)):
      raise ValueError(f"TracePlayer: time_scale must be a finite number > 0, got {time_scale}")
    self.trace, self.time_scale, self.origin = trace, float(time_scale), float(origin)
    self._next, self._now = 0, -math.inf

  def host_time(self, t: float) -> float:
    """Host-clock seconds at which trace time `t` fires."""
    return self.origin + t * self.time_scale

  def next_time(self) -> float | None:
    """Host time of the next event not yet returned (None when all were)."""
    ev = self.trace.events
    return self.host_time(ev[self._next].t) if self._next < len(ev) else None

  @property
  def done(self) -> bool:
    return self._next >= len(self.trace.events)

  def due(self, now: float) -> list[TraceEvent]:
    if now < self._now:
      raise ValueError(f"TracePlayer.due: clock went back ({now} < {self._now})")
    self._now = now
    ev, out = self.trace.events, []
    while self._next < len(ev) and self.host_time(ev[self._next].t) <= now:
      out.append(ev[self._next])
      self._next += 1
    return out


class ChaosSchedule:
  """Seeded random preemptions of `slots` abstract nodes ("slot-0", ...), generated lazily.

  All slots are added at `start` (unless `initial_adds=False`: the host starts them itself).
  Kill times follow `start` by inter-arrival gaps of mean `kill_every` seconds: exponential
  (a Poisson process) or uniform on [0.5, 1.5] x kill_every. A kill removes a uniformly chosen
  live slot (none live: the kill is skipped); the slot is added back `restart_after` seconds
  later (math.inf: never). `due(now)` returns events whose time is <= now, each once, in time
  order; the sequence depends only on the arguments, not on how `due` is called.
  """

  def __init__(self, kill_every: float, seed: int = 0, restart_after: float = 0.0,
               slots: int = 1, distribution: str = "exponential", start: float = 0.0,
               initial_adds: bool = True):
    if not kill_every > 0 or restart_after < 0 or slots < 1 or start < 0:
      raise ValueError("ChaosSchedule: need kill_every > 0, restart_after >= 0, slots >= 1, "
                       f"start >= 0; got {kill_every}, {restart_after}, {slots}, {start}")
    if distribution not in ("exponential", "uniform"):
      raise ValueError(f"ChaosSchedule: distribution must be exponential or uniform, got "
                       f"{distribution!r}")
    self.kill_every, self.seed, self.restart_after = float(kill_every), seed, float(restart_after)
    self.slots, self.distribution, self.start = slots, distribution, float(start)
    self.initial_adds = initial_adds
    self._rng = np.random.default_rng(seed)
    self._live = set(range(slots))
    self._restarts: list[tuple[float, int]] = []
    self._next_kill = self.start + self._gap()
    self._buffer = [TraceEvent(self.start, ADD, self._name(i)) for i in range(slots)] \
        if initial_adds else []
    self._buffer.reverse()  # popped from the end
    self._now = -math.inf

  @staticmethod
  def _name(i: int) -> str:
    return f"slot-{i}"

  def _gap(self) -> float:
    if self.distribution == "exponential":
      return float(self._rng.exponential(self.kill_every))
    return float(self._rng.uniform(0.5, 1.5) * self.kill_every)

  def _generate(self) -> TraceEvent | None:
    while self._live or self._restarts:
      if self._restarts and self._restarts[0][0] <= self._next_kill:
        t, i = heapq.heappop(self._restarts)
        self._live.add(i)
        return TraceEvent(t, ADD, self._name(i))
      t, self._next_kill = self._next_kill, self._next_kill + self._gap()
      if self._live:
        live = sorted(self._live)
        i = live[int(self._rng.integers(len(live)))]
        self._live.remove(i)
        if math.isfinite(self.restart_after):
          heapq.heappush(self._restarts, (t + self.restart_after, i))
        return TraceEvent(t, REMOVE, self._name(i))
    return None  # every slot is dead for good (restart_after = inf)

  def next_time(self) -> float:
    """Time of the next event not yet returned (math.inf when there is none)."""
    if not self._buffer:
      ev = self._generate()
      if ev is None:
        return math.inf
      self._buffer.append(ev)
    return self._buffer[-1].t

  def due(self, now: float) -> list[TraceEvent]:
    if now < self._now:
      raise ValueError(f"ChaosSchedule.due: clock went back ({now} < {self._now})")
    self._now, out = now, []
    while self.next_time() <= now:
      out.append(self._buffer.pop())
    return out

  def to_trace(self, duration: float) -> Trace:
    """The events up to `duration` seconds as a Trace (a fresh schedule; self is untouched)."""
    if duration < self.start:
      raise ValueError(f"to_trace: duration {duration} is before start {self.start}")
    fresh = ChaosSchedule(self.kill_every, self.seed, self.restart_after, self.slots,
                          self.distribution, self.start, self.initial_adds)
    events = tuple(fresh.due(duration))
    if not self.initial_adds:  # the host's own starts, so the trace stays well-formed
      events = tuple(TraceEvent(self.start, ADD, self._name(i)) for i in range(self.slots)) \
          + events
    return Trace(events, duration, f"chaos(every={self.kill_every:g},seed={self.seed})")

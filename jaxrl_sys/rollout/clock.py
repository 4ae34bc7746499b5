"""Time as an injected dependency: the rollout manager, the offload controller and the trainer's
host loop read time only through a `Clock`, so the same code runs on the wall clock (real runs,
Ray workers), on a manual clock (tests with scripted workers) and on the simulator's virtual
clock.

A clock has two methods: `now()` (seconds, monotonic, arbitrary origin) and `sleep(dt)`.
`ManualClock.sleep` advances time instead of waiting.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
  """Monotonic seconds (`now`) and a way to let time pass (`sleep`)."""

  def now(self) -> float: ...

  def sleep(self, seconds: float) -> None: ...


class WallClock:
  """`time.monotonic` and `time.sleep`: the clock of real runs."""

  def now(self) -> float:
    return time.monotonic()

  def sleep(self, seconds: float) -> None:
    if seconds > 0:
      time.sleep(seconds)


class ManualClock:
  """A clock that moves only when told to: `advance(dt)`, `set(t)` or `sleep(dt)`.

  Used by tests with scripted workers and by the simulator (a virtual clock).
  """

  def __init__(self, start: float = 0.0):
    self.t = float(start)

  def now(self) -> float:
    return self.t

  def sleep(self, seconds: float) -> None:
    self.advance(max(seconds, 0.0))

  def advance(self, seconds: float) -> None:
    if seconds < 0:
      raise ValueError(f"ManualClock cannot go back in time ({seconds} s)")
    self.t += float(seconds)

  def set(self, t: float) -> None:
    if t < self.t:
      raise ValueError(f"ManualClock cannot go back in time: {t} < {self.t}")
    self.t = float(t)


WALL = WallClock()

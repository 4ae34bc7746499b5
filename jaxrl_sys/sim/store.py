"""The simulator's weight store: versions without arrays, only their size.

Implements `rollout.weights.WeightStore` for the real manager: `publish` commits at once (the
GPU -> host-buffer copy is part of the trainer's per-step overhead), `ref(v)` is a
`SimWeightRef(version, nbytes)` that a simulated worker turns into a transfer time. `fetch`
returns no arrays: nothing in the simulator computes with weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable


@dataclasses.dataclass(frozen=True)
class SimWeightRef:
  """A committed version: `version`, and `nbytes` a pull moves."""
  version: int
  nbytes: int

  def fetch(self) -> tuple[Any, Any]:
    return None, None


class SimWeightStore:
  """Versions of `nbytes` each (see the module docstring)."""

  def __init__(self, nbytes: int):
    self.nbytes = int(nbytes)
    self.versions: list[int] = []

  def publish(self, version: int, params: Any = None, moe_state: Any = None) -> None:  # pylint: disable=unused-argument
    if self.versions and version <= self.versions[-1]:
      raise ValueError(f"weight version {version} is not newer than {self.versions[-1]}")
    self.versions.append(int(version))

  def ref(self, version: int | None = None) -> SimWeightRef | None:
    if not self.versions:
      return None
    v = self.versions[-1] if version is None else int(version)
    return SimWeightRef(v, self.nbytes) if v in self.versions else None

  def latest(self) -> int | None:
    return self.versions[-1] if self.versions else None

  def gc(self, in_use: Iterable[int]) -> list[int]:
    keep = set(int(v) for v in in_use)
    drop = [v for v in self.versions[:-1] if v not in keep]
    self.versions = [v for v in self.versions if v not in drop]
    return drop

  def check(self) -> None:
    return

  def wait(self) -> None:
    return

  def close(self) -> None:
    return

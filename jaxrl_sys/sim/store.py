"""The simulator's weight store: versions without arrays, only their size.

Implements `rollout.weights.WeightStore` for the real manager: `publish` commits at once (the
GPU -> host-buffer copy is part of the trainer's per-step overhead), `published(v)` is a
`SimWeightRef(version, nbytes)` that a simulated worker turns into a transfer time. `load`
returns no arrays: nothing in the simulator computes with weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_sys.rollout.weights.base import VersionTable


@dataclasses.dataclass(frozen=True)
class SimWeightRef:
  """A committed version: `version`, and `nbytes` a pull moves."""
  version: int
  nbytes: int

  def load(self) -> tuple[Any, Any]:
    return None, None


class SimWeightStore(VersionTable):
  """Versions of `nbytes` each (see the module docstring)."""

  def __init__(self, nbytes: int):
    super().__init__()
    self.nbytes = int(nbytes)

  def publish(self, params: Any, version: int, moe_state: Any = None) -> None:
    del params, moe_state
    self.commit(version, SimWeightRef(int(version), self.nbytes))

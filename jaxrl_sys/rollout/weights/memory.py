"""The in-memory weight store: versions kept as the published pytrees (zero copy), for workers
in the trainer's process (the embedded default)."""
from __future__ import annotations

from typing import Any

from jaxrl_sys.rollout.weights.base import BaseRef, BaseWeights, VersionTable


def _nbytes(tree) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


class MemoryWeightRef:
  """A version held in this process's memory: `load` returns the arrays themselves; `base`:
  the LoRA base's `BaseRef` (None for full weights)."""

  def __init__(self, version: int, params: Any, moe_state: Any, base: BaseRef | None = None):
    self.version, self._tree = int(version), (params, moe_state)
    self.nbytes = _nbytes(self._tree)
    self.base = base

  def load(self) -> tuple[Any, Any]:
    return self._tree

  def __reduce__(self):
    raise TypeError("the in-memory weight store only serves workers in the trainer's process; "
                    "use --weight_store=ray or --weight_store=tensorstore:PATH for Ray workers")


class MemoryWeightStore(VersionTable):
  """Versions kept as the published pytrees (zero copy). The arrays must not be donated or
  mutated after `publish` (the train step donates everything but the parameters)."""

  def __init__(self):
    super().__init__()
    self._base: BaseRef | None = None  # the newest LoRA base (zero copy, like the versions)

  def publish(self, params: Any, version: int, moe_state: Any = None,
              base: BaseWeights | None = None) -> None:
    ref = None
    if base is not None:
      if self._base is None or self._base.digest != base.digest:
        snapshot = MemoryWeightRef(-1, base.params, None)
        self._base = BaseRef(base.digest, snapshot.nbytes, snapshot)
      ref = self._base
    self.commit(version, MemoryWeightRef(version, params, moe_state, ref))

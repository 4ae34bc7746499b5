"""The in-memory weight store: versions kept as the published pytrees (zero copy), for workers
in the trainer's process (the embedded default)."""
from __future__ import annotations

from typing import Any

from jaxrl_sys.rollout.weights.base import VersionTable


def _nbytes(tree) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


class MemoryWeightRef:
  """A version held in this process's memory: `load` returns the arrays themselves."""

  def __init__(self, version: int, params: Any, moe_state: Any):
    self.version, self._tree = int(version), (params, moe_state)
    self.nbytes = _nbytes(self._tree)

  def load(self) -> tuple[Any, Any]:
    return self._tree

  def __reduce__(self):
    raise TypeError("the in-memory weight store only serves workers in the trainer's process; "
                    "use --weight_store=ray or --weight_store=tensorstore:PATH for Ray workers")


class MemoryWeightStore(VersionTable):
  """Versions kept as the published pytrees (zero copy). The arrays must not be donated or
  mutated after `publish` (the train step donates everything but the parameters)."""

  def publish(self, params: Any, version: int, moe_state: Any = None) -> None:
    self.commit(version, MemoryWeightRef(version, params, moe_state))

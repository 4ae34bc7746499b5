"""Weight store on the Ray object store (the only weights module that imports Ray, lazily;
`pip install -e .[ray]`).

The trainer process `ray.put`s each version once (a background thread, after a synchronous host
copy); a `RayWeightRef` carries the `ObjectRef` as a field of a plain object, so when the ref
travels inside an actor call (`worker.Commands.load`) Ray passes it on as a borrowed reference
instead of resolving it, and the actor loads the arrays itself with `load()` (zero copy from
the node's shared memory, then every chunk's crc32 is checked against the checksums computed at
publish). Objects are owned by the trainer: they die with it, and live while the store or a
borrowing worker still holds their ref; `gc` drops the store's refs of versions no worker uses.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrl_sys.rollout.weights.base import CorruptWeightsError
from jaxrl_sys.rollout.weights.io import (BackgroundPublisher, BackgroundStore, chunk_crcs,
                                          dtype_from_name, host_leaves, verify_leaves)


def import_ray():
  """`import ray`, or an error that says how to install it."""
  try:
    import ray  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("the Ray weight store needs Ray: install it with `pip install -e .[ray]` "
                      "(or use --weight_store=memory or --weight_store=tensorstore:PATH)") from e
  return ray


@dataclasses.dataclass(frozen=True)
class RayWeightRef:
  """A committed version in the Ray object store.

  Attributes:
    version, nbytes: the version and the total bytes of its arrays.
    object_ref: the `ray.ObjectRef` of the list of host leaves of `(params, moe_state)` in
      flatten order; leaves of non-numpy dtypes (bfloat16, ...) are stored as same-size
      unsigned-int views, since numpy pickles those in-band and `ray.get` would copy them.
    treedef: the jax treedef of `(params, moe_state)`.
    dtypes: per leaf, its dtype name.
    crc32: per leaf, the crc32 of each `weights.CHUNK_BYTES` slice.
    paths: per leaf, its key path (for error messages).
  """
  version: int
  nbytes: int
  object_ref: Any
  treedef: Any
  dtypes: tuple[str, ...]
  crc32: tuple[tuple[int, ...], ...]
  paths: tuple[str, ...]

  def load(self) -> tuple[Any, Any]:
    """`(params, moe_state)` as read-only numpy arrays in shared memory (zero copy on the same
    node), every chunk's crc32 verified.

    Raises:
      CorruptWeightsError: a leaf differs from what was published.
      ray.exceptions.ObjectLostError: the trainer (the owner) is gone.
    """
    import jax  # pylint: disable=import-outside-toplevel
    leaves = import_ray().get(self.object_ref)
    where = f"ray object {self.object_ref.hex()}"
    if not (isinstance(leaves, list) and all(isinstance(x, np.ndarray) for x in leaves)):
      raise CorruptWeightsError(f"weight version {self.version} at {where}: not a list of "
                                "arrays")
    verify_leaves(leaves, [list(c) for c in self.crc32], list(self.paths), self.version, where)
    leaves = [x if x.dtype.name == d else x.view(dtype_from_name(d))
              for x, d in zip(leaves, self.dtypes)]
    return jax.tree.unflatten(self.treedef, leaves)


def _storable(x: np.ndarray) -> np.ndarray:
  """`x`, or its unsigned-int view when numpy would pickle its dtype in-band (ml_dtypes)."""
  return x if x.dtype.isbuiltin == 1 else x.view(f"u{x.dtype.itemsize}")


class RayWeightStore(BackgroundStore):
  """Versions `ray.put` by the trainer's process; needs Ray started (`ray.init`, or
  `rollout.workers.ray.init_ray`).

  Args:
    max_pending: host copies allowed to wait for `ray.put` before `publish` blocks.
  """

  def __init__(self, *, max_pending: int = 2):
    ray = import_ray()
    if not ray.is_initialized():
      raise RuntimeError("the Ray weight store needs a running Ray: call ray.init() (or "
                         "jaxrl_sys.rollout.workers.ray.init_ray()) before creating it")
    super().__init__()
    self._bg = BackgroundPublisher("ray", max_pending)

  def publish(self, params: Any, version: int, moe_state: Any = None) -> None:
    leaves, treedef = host_leaves(params, moe_state)
    self._bg.submit(int(version), lambda: self._put(int(version), leaves, treedef))

  def _put(self, version: int, leaves: list[np.ndarray], treedef: Any) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    paths = tuple(jax.tree_util.keystr(p) for p, _ in
                  jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(treedef, leaves))[0])
    crcs = tuple(tuple(c) for c in chunk_crcs(leaves))
    object_ref = import_ray().put([_storable(x) for x in leaves])
    ref = RayWeightRef(version, sum(x.nbytes for x in leaves), object_ref, treedef,
                       tuple(x.dtype.name for x in leaves), crcs, paths)
    self.commit(version, ref)

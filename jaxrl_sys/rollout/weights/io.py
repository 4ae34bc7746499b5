"""Shared by the copying weight stores (tensorstore files, the Ray object store): host copies of
the published tree, chunked crc32 checksums, the tree structure as JSON (no pickle in shared
files), and the background publisher that keeps `publish` off the trainer's critical path."""
from __future__ import annotations

import concurrent.futures as cf
import importlib
import logging
import os
import sys
import threading
import zlib
from typing import Any, Callable

import numpy as np

from jaxrl_sys.rollout.weights.base import CorruptWeightsError, VersionTable, WeightPublishError

CHUNK_BYTES = 8 << 20  # one crc32 per 8 MiB of an array: one big array verifies in parallel
_log = logging.getLogger(__name__)


# ----- shared by the copying backends: host copies, checksums, background publishing -----------
_POOL: cf.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> cf.ThreadPoolExecutor:
  """The process-wide verification threads (zlib and file reads release the GIL)."""
  global _POOL
  with _POOL_LOCK:
    if _POOL is None:
      _POOL = cf.ThreadPoolExecutor(max(2, min(8, os.cpu_count() or 2)), "weights-verify")
    return _POOL


def run_parallel(tasks: list[Callable[[], None]], nbytes: list[int]) -> None:
  """Runs `tasks` (each touching `nbytes` bytes) on the verification threads, small ones grouped
  by >= 1 MiB; waits for all (they may share file descriptors), then re-raises the first
  failure."""
  groups: list[list[Callable[[], None]]] = [[]]
  size = 0
  for task, n in zip(tasks, nbytes):
    if size >= 1 << 20:
      groups.append([])
      size = 0
    groups[-1].append(task)
    size += n
  futures = [_pool().submit(lambda g=g: [t() for t in g]) for g in groups]
  cf.wait(futures)
  for f in futures:
    f.result()


def bytes_view(x: np.ndarray) -> memoryview:
  return memoryview(x.reshape(-1).view(np.uint8))


def host_leaves(params: Any, moe_state: Any) -> tuple[list[np.ndarray], Any]:
  """A private host copy of `(params, moe_state)`: C-contiguous numpy leaves in flatten order and
  the treedef. Device arrays are copied by `jax.device_get` (on CPU a read-only view that keeps
  the buffer alive, donation then copies); numpy leaves are copied (the caller may mutate them)."""
  import jax  # pylint: disable=import-outside-toplevel
  leaves, treedef = jax.tree.flatten((params, moe_state))
  host = jax.device_get(leaves)
  out = [np.array(x) if isinstance(x, np.ndarray) and h is x else np.ascontiguousarray(h)
         for x, h in zip(leaves, host)]
  if sys.byteorder != "little" or any(h.dtype.byteorder == ">" for h in out):
    raise TypeError("the weight store writes little-endian arrays only")
  return out, treedef


def chunk_crcs(leaves: list[np.ndarray]) -> list[list[int]]:
  """crc32 of every `CHUNK_BYTES` slice of every leaf (computed in parallel)."""
  out: list[list[int]] = [[0] * -(-x.nbytes // CHUNK_BYTES) for x in leaves]

  def one(i: int, k: int):
    out[i][k] = zlib.crc32(bytes_view(leaves[i])[k * CHUNK_BYTES:(k + 1) * CHUNK_BYTES])
  idx = [(i, k) for i, c in enumerate(out) for k in range(len(c))]
  run_parallel([lambda i=i, k=k: one(i, k) for i, k in idx],
            [min(CHUNK_BYTES, leaves[i].nbytes - k * CHUNK_BYTES) for i, k in idx])
  return out


def check_chunk(got: int, want: int, where: str, version: int, path: str, k: int) -> None:
  if got != want:
    raise CorruptWeightsError(f"weight version {version} at {where}: array {path} bytes "
                              f"[{k * CHUNK_BYTES}, +{CHUNK_BYTES}) fail their crc32 "
                              f"({got:#010x} != {want:#010x}); not loading it")


def verify_leaves(leaves: list[np.ndarray], crcs: list[list[int]], paths: list[str],
                  version: int, where: str) -> None:
  """Raises `CorruptWeightsError` naming the first array whose chunk crc32s differ."""
  if len(leaves) != len(crcs):
    raise CorruptWeightsError(f"weight version {version} at {where}: {len(leaves)} arrays, the "
                              f"publisher checksummed {len(crcs)}")
  got = chunk_crcs(leaves)
  for i, (g, w) in enumerate(zip(got, crcs)):
    if len(g) != len(w):
      raise CorruptWeightsError(f"weight version {version} at {where}: array {paths[i]} has "
                                f"{leaves[i].nbytes} bytes, not the published size")
    for k, (a, b) in enumerate(zip(g, w)):
      check_chunk(a, b, where, version, paths[i], k)


class BackgroundPublisher:
  """Runs publish jobs in version order on one background thread.

  At most `max_pending` host copies wait or are written at once: a publish beyond that blocks
  until the oldest is written (bounds host memory). Failed jobs are kept for `wait`.
  """

  def __init__(self, name: str, max_pending: int = 2):
    self._exec = cf.ThreadPoolExecutor(1, f"weights-{name}")
    self._jobs: list[tuple[int, cf.Future]] = []
    self._max, self._name, self._closed = max(1, max_pending), name, False
    self._lock = threading.Lock()
    self.last = -1  # the newest version accepted for publishing

  def submit(self, version: int, fn: Callable[[], None]) -> None:
    with self._lock:
      if self._closed:
        raise RuntimeError(f"the {self._name} weight store is closed")
      if version <= self.last:
        raise ValueError(f"weight version {version} is not newer than {self.last}")
      self.last = version
      self._jobs = [(v, f) for v, f in self._jobs if not f.done() or f.exception() is not None]
      busy = [f for _, f in self._jobs if not f.done()]
      self._jobs.append((version, self._exec.submit(self._run, version, fn)))
    for f in busy[:max(0, len(busy) + 1 - self._max)]:
      cf.wait([f])

  def _run(self, version: int, fn: Callable[[], None]) -> None:
    try:
      fn()
    except BaseException as e:  # reported once by `check` / `wait`; the stack only for debugging
      _log.warning("publishing weight version %d (%s) failed: %s: %s", version, self._name,
                   type(e).__name__, e)
      _log.debug("publishing weight version %d failed", version, exc_info=True)
      raise

  def check(self) -> None:
    """Raises `WeightPublishError` for a publish that already failed; never blocks."""
    with self._lock:
      if not any(f.done() and f.exception() is not None for _, f in self._jobs):
        return
    self.wait()

  def wait(self) -> None:
    with self._lock:
      jobs, self._jobs = self._jobs, []
    failed = [(v, f.exception()) for v, f in jobs if f.exception() is not None]
    if failed:
      v, e = failed[0]
      more = f" (and versions {[w for w, _ in failed[1:]]})" if len(failed) > 1 else ""
      raise WeightPublishError(f"publishing weight version {v} to the {self._name} store failed"
                               f"{more}: {type(e).__name__}: {e}") from e

  def close(self) -> None:
    try:
      self.wait()
    finally:
      with self._lock:
        self._closed = True
      self._exec.shutdown(wait=True)


class BackgroundStore(VersionTable):
  """A store whose versions are written by a `BackgroundPublisher` (`self._bg`)."""

  def check(self) -> None:
    """Raises `WeightPublishError` if a background publish failed (non-blocking)."""
    self._bg.check()

  def wait(self) -> None:
    self._bg.wait()

  def close(self) -> None:
    self._bg.close()


# ----- tree structure as JSON (no pickle in shared files) ----------------------------------------
def encode_tree(node: Any) -> Any:
  """The skeleton `jax.tree.unflatten(treedef, range(n))` as JSON; leaf i is `{"i": i}`."""
  if node is None:
    return {"t": "none"}
  if type(node) is int:  # pylint: disable=unidiomatic-typecheck
    return {"t": "leaf", "i": node}
  if type(node) is dict:  # pylint: disable=unidiomatic-typecheck
    if not all(isinstance(k, str) for k in node):
      raise TypeError(f"weight trees need string dict keys, got {list(node)[:4]}")
    return {"t": "dict", "k": list(node), "c": [encode_tree(v) for v in node.values()]}
  if isinstance(node, tuple) and hasattr(type(node), "_fields"):
    cls = type(node)
    return {"t": "namedtuple", "cls": f"{cls.__module__}:{cls.__qualname__}",
            "c": [encode_tree(v) for v in node]}
  if type(node) in (list, tuple):
    return {"t": type(node).__name__, "c": [encode_tree(v) for v in node]}
  raise TypeError(f"weight trees may hold dict, list, tuple, NamedTuple and None nodes; got "
                  f"{type(node).__qualname__}")


def _namedtuple_class(name: str):
  module, qualname = name.split(":")
  obj = importlib.import_module(module)
  for part in qualname.split("."):
    obj = getattr(obj, part)
  if not (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")):
    raise TypeError(f"{name} is not a NamedTuple class")
  return obj


def decode_tree(enc: Any, leaves: list[Any]) -> Any:
  t = enc["t"]
  if t == "none":
    return None
  if t == "leaf":
    return leaves[enc["i"]]
  c = [decode_tree(x, leaves) for x in enc["c"]]
  build = {"dict": lambda: dict(zip(enc["k"], c)), "list": lambda: c, "tuple": lambda: tuple(c),
           "namedtuple": lambda: _namedtuple_class(enc["cls"])(*c)}
  if t not in build:
    raise ValueError(f"unknown tree node {t!r}")
  return build[t]()


def dtype_from_name(name: str) -> np.dtype:
  """`np.dtype(name)`, also for the ml_dtypes names jax uses ("bfloat16", "float8_e4m3fn")."""
  try:
    return np.dtype(name)
  except TypeError:
    import ml_dtypes  # pylint: disable=import-outside-toplevel
    return np.dtype(getattr(ml_dtypes, name))

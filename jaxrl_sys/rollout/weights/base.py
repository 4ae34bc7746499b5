"""Pull-based weight store: the trainer publishes version v once and goes on; each worker loads
the version it is told about (or the newest) itself, without blocking the trainer or the other
workers.

Two roles:
- the trainer side, a `WeightStore`: `publish(params, version, moe_state)` returns at once
  (slow backends write in the background); `published(version)` gives a `WeightRef` once the
  version is committed; `gc(in_use)` drops versions no worker uses any more;
- the worker side, a `WeightRef`: small plain data that crosses processes inside
  `worker.Commands.load`; `ref.load()` reads `(params, moe_state)` and verifies them.

One verb pair end to end: the trainer *publishes* a version (`RolloutClient.publish` ->
`WeightStore.publish`), a worker *loads* it (`Commands.load` -> `WorkerServer.load` ->
`WeightRef.load` -> `Engine.load`).

Backends (looked up by name in `weights.factory.make_weight_store`):
- `weights.memory.MemoryWeightStore`: the embedded default; the trainer's device arrays
  themselves (zero copy), so only workers in the trainer's process can use it.
- `weights.tensorstore.TensorstoreWeightStore`: files under a directory or any tensorstore
  kvstore URL (`file://`, `gs://`, `memory://`), for workers on other machines; a worker that
  starts on its own finds the newest version with `tensorstore.open_latest(path)`.
- `weights.ray.RayWeightStore`: the Ray object store (objects die with the trainer).

Integrity: every array carries one zlib crc32 per `weights.io.CHUNK_BYTES` slice, computed once
at publish and checked by every `load` (chunks are read and checked in parallel threads); a
corrupt, truncated, missing or half-deleted version raises `CorruptWeightsError` and is never
returned.

Tensorstore layout of version v (a one-key write is atomic on every kvstore; many keys are not):
`v{v}/a{i}` the raw little-endian bytes of leaf i of `(params, moe_state)` in flatten order, then
`v{v}/manifest.json` (tree structure, leaf key paths, shapes, dtypes, checksums, total bytes),
then the one key `LATEST` (`{"version", "nbytes", "manifest_crc32"}`). A reader goes LATEST ->
manifest (checked against the crc32 it was committed with) -> arrays, so it never sees a
half-written version; `gc` deletes a manifest before its arrays, so a concurrent reader fails
cleanly.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterable, Protocol


_log = logging.getLogger(__name__)


class CorruptWeightsError(RuntimeError):
  """A published version failed its integrity check (checksum or manifest); never loaded."""


class WeightPublishError(RuntimeError):
  """A background publish failed; the version was never committed (raised by `wait`)."""


class WeightRef(Protocol):
  """A committed weight version, as a worker receives it.

  Attributes:
    version: the weight version.
    nbytes: total bytes of the arrays.
  """
  version: int
  nbytes: int

  def load(self) -> tuple[Any, Any]:
    """Reads `(params, moe_state)` (host or device arrays); raises `CorruptWeightsError`."""


class WeightStore(Protocol):
  """The trainer's side of the store."""

  def publish(self, params: Any, version: int, moe_state: Any = None) -> None:
    """Makes `version` available (the argument order of `RolloutClient.publish`); returns
    without waiting for slow writes."""

  def published(self, version: int | None = None) -> WeightRef | None:
    """The reference workers load committed `version` from (default: the newest), or None
    while it is not committed."""

  def latest(self) -> int | None:
    """The newest committed version (None before the first commit)."""

  def gc(self, in_use: Iterable[int]) -> list[int]:
    """Drops committed versions older than the newest that are not in `in_use`."""

  def check(self) -> None:
    """Raises `WeightPublishError` if a background publish failed; never blocks."""

  def wait(self) -> None:
    """Blocks until every publish so far is committed (re-raises a failed write)."""

  def close(self) -> None:
    """Waits, then releases resources (files stay)."""


class VersionTable:
  """Committed versions -> refs, thread-safe: the part every store shares."""

  def __init__(self):
    self._refs: dict[int, Any] = {}
    self._lock = threading.Lock()

  def published(self, version: int | None = None):
    with self._lock:
      if version is None:
        version = max(self._refs) if self._refs else None
      return self._refs.get(version)

  def latest(self) -> int | None:
    with self._lock:
      return max(self._refs) if self._refs else None

  def commit(self, version: int, ref: Any) -> None:
    """Makes `ref` the committed `version`; versions must increase."""
    with self._lock:
      if self._refs and version <= max(self._refs):
        raise ValueError(f"weight version {version} is not newer than {max(self._refs)}")
      self._refs[int(version)] = ref

  def check(self) -> None:
    """Raises a failed background publish (stores that write in the background override it)."""
    return

  def wait(self) -> None:
    return

  def close(self) -> None:
    return

  def gc(self, in_use: Iterable[int]) -> list[int]:
    """Forgets committed versions older than the newest that are not in `in_use`."""
    keep = set(int(v) for v in in_use)
    with self._lock:
      newest = max(self._refs) if self._refs else None
      drop = [v for v in self._refs if v != newest and v not in keep]
      for v in drop:
        del self._refs[v]
    return sorted(drop)

"""The tensorstore weight store: versions as files under a directory or any tensorstore kvstore
URL (`file://`, `gs://`, `memory://`), for workers on other machines (layout in `weights`).

Every kvstore operation has a deadline (`weights.kvstore`: `REMOTE_TIMEOUT_S` for a small one,
plus `MIN_BYTES_PER_S` for a data write or read; tensorstore itself retries an endpoint it cannot
reach, e.g. `gs://` without credentials or network, for many minutes). A store that does not
answer raises `WeightStoreUnreachableError` (the constructor, so a run stops before training) or
fails the publish. A failed publish (a full disk, a lost connection) deletes what it wrote of its
version: no partial version is left behind.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import zlib
from typing import Any, Iterable

import numpy as np

from jaxrl_sys.rollout.weights.base import BaseRef, BaseWeights, CorruptWeightsError
from jaxrl_sys.rollout.weights import io as weights_io
from jaxrl_sys.rollout.weights.io import (BackgroundPublisher, BackgroundStore,
                                          bytes_view, check_chunk, decode_tree, encode_tree,
                                          run_parallel, dtype_from_name, host_leaves, verify_leaves)
from jaxrl_sys.rollout.weights.kvstore import (WeightStoreUnreachableError,  # noqa: F401
                                               local_dir, open_kvstore, prefix_range, read_key,
                                               result, root_url, settle)

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TensorstoreWeightRef:
  """Committed version `version` under `url`: plain data, pickles anywhere.

  Attributes:
    url: the kvstore URL of the store's root (ends with "/").
    version, nbytes: the version and the total bytes of its arrays.
    manifest_crc32: crc32 of the committed manifest (a replaced manifest is refused).
    base: with LoRA, the `BaseRef` of the base (its snapshot a `TensorstoreWeightRef` of
      `(base, None)` under `base/<digest>/`, written once per digest); None for full weights.
    prefix: the keys' directory (None: `v<version>/`).
  """
  url: str
  version: int
  nbytes: int
  manifest_crc32: int
  base: BaseRef | None = None
  prefix: str | None = None

  def load(self) -> tuple[Any, Any]:
    """Reads and verifies `(params, moe_state)` as host numpy arrays (bfloat16 via ml_dtypes).

    Raises:
      CorruptWeightsError: manifest or array missing, truncated, or failing its crc32.
    """
    v, where = self.version, self.url
    prefix = self.prefix or f"v{v}/"
    raw = read_key(self.url, f"{prefix}manifest.json")
    if raw is None:
      raise CorruptWeightsError(f"weight version {v} at {where}: manifest.json is missing "
                                "(deleted by gc, or never committed)")
    if zlib.crc32(raw) != self.manifest_crc32:
      raise CorruptWeightsError(f"weight version {v} at {where}: manifest.json fails its crc32")
    try:
      m = json.loads(raw)
      arrays = [(a["path"], f"{prefix}{a['key']}", tuple(a["shape"]),
                 dtype_from_name(a["dtype"]), a["crc32"]) for a in m["arrays"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise CorruptWeightsError(f"weight version {v} at {where}: bad manifest ({e})") from e
    local = local_dir(self.url)
    leaves = (_read_files(local, arrays, v, where) if local is not None
              else _read_kvstore(open_kvstore(self.url), arrays, v, where))
    try:
      return decode_tree(m["tree"], leaves)
    except (ValueError, KeyError, TypeError, IndexError, ImportError, AttributeError) as e:
      raise CorruptWeightsError(f"weight version {v} at {where}: bad tree in manifest ({e})") from e


def _host_tree(params: Any, moe_state: Any) -> tuple[list[np.ndarray], Any, list[str]]:
  """(host leaves, JSON tree, leaf paths) of `(params, moe_state)`."""
  import jax  # pylint: disable=import-outside-toplevel
  leaves, treedef = host_leaves(params, moe_state)
  tree = encode_tree(jax.tree.unflatten(treedef, list(range(len(leaves)))))
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(treedef, leaves))[0]]
  return leaves, tree, paths


def _size_error(v: int, where: str, path: str, got: int, want: int) -> CorruptWeightsError:
  kind = "truncated" if got < want else "too long"
  return CorruptWeightsError(f"weight version {v} at {where}: array {path} is {kind} "
                             f"({got} of {want} bytes)")


def _read_files(root: str, arrays, v: int, where: str) -> list[np.ndarray]:
  """The `file` kvstore fast path: `preadv` straight into the arrays, crc32 each chunk as read."""
  bufs = [np.empty(shape, dtype) for _, _, shape, dtype, _ in arrays]
  fds: list[int] = []
  try:
    tasks, sizes = [], []
    for (path, key, _, _, crcs), buf in zip(arrays, bufs):
      try:
        fds.append(os.open(os.path.join(root, key), os.O_RDONLY))
      except FileNotFoundError as e:
        raise CorruptWeightsError(f"weight version {v} at {where}: array {path} is missing "
                                  "(deleted by gc, or never written)") from e
      size = os.fstat(fds[-1]).st_size
      if size != buf.nbytes:
        raise _size_error(v, where, path, size, buf.nbytes)
      if len(crcs) != -(-buf.nbytes // weights_io.CHUNK_BYTES):
        raise CorruptWeightsError(f"weight version {v} at {where}: the manifest lists "
                                  f"{len(crcs)} checksums for the {size} bytes of {path}")
      for k, want in enumerate(crcs):
        tasks.append(lambda fd=fds[-1], mv=bytes_view(buf), k=k, want=want, path=path:
                     _read_chunk(fd, mv, k, want, v, where, path))
        sizes.append(min(weights_io.CHUNK_BYTES, size - k * weights_io.CHUNK_BYTES))
    run_parallel(tasks, sizes)
  finally:
    for fd in fds:
      os.close(fd)
  return bufs


def _read_chunk(fd: int, mv: memoryview, k: int, want: int, v: int, where: str, path: str):
  part = mv[k * weights_io.CHUNK_BYTES:(k + 1) * weights_io.CHUNK_BYTES]
  n = os.preadv(fd, [part], k * weights_io.CHUNK_BYTES)
  if n != len(part):
    raise _size_error(v, where, path, k * weights_io.CHUNK_BYTES + n, len(mv))
  check_chunk(zlib.crc32(part), want, where, v, path, k)


def _read_kvstore(kv, arrays, v: int, where: str) -> list[np.ndarray]:
  """Any other kvstore: read every key concurrently, then verify in parallel."""
  futures = [kv.read(key) for _, key, _, _, _ in arrays]
  leaves = []
  for (path, key, shape, dtype, _), f in zip(arrays, futures):
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = result(f, where, f"reading {key}", want)
    if got.state != "value":
      raise CorruptWeightsError(f"weight version {v} at {where}: array {path} is missing "
                                "(deleted by gc, or never written)")
    if len(got.value) != want:
      raise _size_error(v, where, path, len(got.value), want)
    leaves.append(np.frombuffer(got.value, dtype).reshape(shape))
  verify_leaves(leaves, [a[4] for a in arrays], [a[0] for a in arrays], v, where)
  return leaves


def _base_ref(url: str, entry: dict | None) -> BaseRef | None:
  """The `BaseRef` a manifest or LATEST pointer names (`{"digest", "nbytes",
  "manifest_crc32"}`), or None."""
  if entry is None:
    return None
  digest, nbytes = str(entry["digest"]), int(entry["nbytes"])
  snapshot = TensorstoreWeightRef(url, -1, nbytes, int(entry["manifest_crc32"]),
                                  prefix=f"base/{digest}/")
  return BaseRef(digest, nbytes, snapshot)


def _read_latest(url: str) -> TensorstoreWeightRef | None:
  raw = read_key(url, "LATEST")
  if raw is None:
    return None
  try:
    p = json.loads(raw)
    return TensorstoreWeightRef(url, int(p["version"]), int(p["nbytes"]), int(p["manifest_crc32"]),
                                _base_ref(url, p.get("base")))
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptWeightsError(f"{url}LATEST is not a weight pointer ({e}): {raw[:80]!r}") from e


def open_latest(path_or_url: str | os.PathLike) -> TensorstoreWeightRef | None:
  """The newest committed version under `path_or_url` (a directory or kvstore URL), or None
  before the first commit: what a worker that starts on its own calls."""
  return _read_latest(root_url(path_or_url))


class TensorstoreWeightStore(BackgroundStore):
  """Versions written under a directory or tensorstore kvstore URL (see the module docstring).

  `publish` takes a host copy synchronously and writes in the background; `published(v)` is
  None until v's `LATEST` pointer is written. Opening an existing root resumes it: committed
  versions are listed, and half-written ones (a crashed publish) are deleted by the next `gc`.

  Args:
    path_or_url: a local directory, or a kvstore URL (`file:///d/`, `gs://bucket/run/`, ...).
    max_pending: host copies allowed to wait for writing before `publish` blocks.
  """

  def __init__(self, path_or_url: str | os.PathLike, *, max_pending: int = 2):
    self.url = root_url(path_or_url)
    self._kv = open_kvstore(self.url)
    super().__init__()
    latest = _read_latest(self.url)
    dirs: dict[int, bool] = {}
    for key in result(self._kv.list(), self.url, "listing its versions"):
      hit = re.fullmatch(r"v(\d+)/(.*)", key.decode())
      if hit:
        v = int(hit.group(1))
        dirs[v] = dirs.get(v, False) or hit.group(2) == "manifest.json"
    top = -1 if latest is None else latest.version
    self._refs: dict[int, TensorstoreWeightRef | None] = {
        v: None for v, has_manifest in dirs.items() if has_manifest and v <= top}
    if latest is not None:
      self._refs[top] = latest
    self._orphans = set(dirs) - set(self._refs)
    self._bg = BackgroundPublisher(self.url, max_pending)
    # Versions increase within this store object; the first publish may go back to a version an
    # earlier opening committed (a run resumed from an earlier checkpoint): see `publish`.
    self._earlier_top = top
    # LoRA bases written so far (digest -> manifest entry), found again when reopened.
    self._bases: dict[str, dict] = {}
    for key in result(self._kv.list(), self.url, "listing its bases"):
      hit = re.fullmatch(r"base/([0-9a-f]+)/manifest\.json", key.decode())
      if hit:
        raw = read_key(self.url, key.decode())
        self._bases[hit.group(1)] = {"digest": hit.group(1),
                                     "nbytes": int(json.loads(raw)["nbytes"]),
                                     "manifest_crc32": zlib.crc32(raw)}
    self._base_pending = set(self._bases)

  def publish(self, params: Any, version: int, moe_state: Any = None,
              base: BaseWeights | None = None) -> None:
    """Publishes `version` (see `WeightStore.publish`); with LoRA, a `base` this store has not
    written yet is written once, under `base/<digest>/`, before the version that names it. The
    first publish after opening an existing root may name a version at or below the newest one
    committed before (a run resumed from an earlier step): the versions from that one on belong
    to a future that did not happen, and are dropped before it is written."""
    version = int(version)
    stale: list[int] = []
    if version <= self._earlier_top:
      with self._lock:
        stale = sorted(w for w in set(self._refs) | self._orphans if w >= version)
        for w in stale:
          self._refs.pop(w, None)
          self._orphans.discard(w)
    self._earlier_top = -1
    leaves, tree, paths = _host_tree(params, moe_state)
    write_base = None
    if base is not None and base.digest not in self._base_pending:
      # A new base: its host copy now, written before the version (one publisher thread).
      self._base_pending.add(base.digest)
      b = _host_tree(base.params, None)
      write_base = lambda: self._write_base(base.digest, *b)  # noqa: E731
    digest = None if base is None else base.digest

    def job():
      if stale:  # LATEST first (it may name one), then the versions, each manifest first
        result(self._kv.delete_range(prefix_range("LATEST")), self.url, "deleting LATEST")
        for w in stale:
          self._discard(w)
          with self._lock:
            self._orphans.discard(w)
      if write_base is not None:
        write_base()
      self._write(version, leaves, tree, paths, digest)

    self._bg.submit(version, job)

  def _put(self, key: str, value: bytes):
    """One kvstore write (a future); tests replace it to simulate a crash."""
    return self._kv.write(key, value)

  def _write_base(self, digest: str, leaves: list[np.ndarray], tree: Any,
                  paths: list[str]) -> None:
    """Writes a LoRA base under `base/<digest>/` (arrays, then its manifest: committed); a
    failed write deletes what it wrote and may be retried by the next publish."""
    prefix = f"base/{digest}/"
    try:
      nbytes, crc = self._write_tree(prefix, -1, leaves, tree, paths)
    except BaseException:
      self._base_pending.discard(digest)
      try:
        result(self._kv.delete_range(prefix_range(prefix)), self.url, f"deleting {prefix}")
      except Exception as e:  # pylint: disable=broad-except  (the write's failure is reported)
        _log.warning("could not delete the partial LoRA base %s at %s: %s", digest, self.url, e)
      raise
    with self._lock:
      self._bases[digest] = {"digest": digest, "nbytes": nbytes, "manifest_crc32": crc}

  def _write(self, v: int, leaves: list[np.ndarray], tree: Any, paths: list[str],
             base: str | None = None) -> None:
    entry = None if base is None else self._bases[base]
    try:
      nbytes, crc = self._write_tree(f"v{v}/", v, leaves, tree, paths, entry)
      ref = TensorstoreWeightRef(self.url, v, nbytes, crc, _base_ref(self.url, entry))
      latest = {"version": v, "nbytes": nbytes, "manifest_crc32": crc}
      if entry is not None:
        latest["base"] = entry
      result(self._put("LATEST", json.dumps(latest).encode()), self.url, "writing LATEST")
    except BaseException:
      self._discard(v)
      raise
    with self._lock:
      self._refs[v] = ref
      self._orphans.discard(v)

  def _write_tree(self, prefix: str, v: int, leaves: list[np.ndarray], tree: Any,
                  paths: list[str], base: dict | None = None) -> tuple[int, int]:
    """Writes the arrays under `prefix`, then their manifest; returns (bytes, manifest crc32).
    Every write has its deadline (`result`); on a failure no write of the attempt lands
    after it is reported."""
    # leftovers of a crashed attempt
    result(self._kv.delete_range(prefix_range(prefix)), self.url, f"clearing {prefix}")
    arrays, inflight = [], []
    try:
      for i, (x, path) in enumerate(zip(leaves, paths)):
        crcs = [zlib.crc32(bytes_view(x)[o:o + weights_io.CHUNK_BYTES])
                for o in range(0, x.nbytes, weights_io.CHUNK_BYTES)]
        arrays.append({"key": f"a{i}", "path": path, "shape": list(x.shape),
                       "dtype": x.dtype.name, "nbytes": x.nbytes, "crc32": crcs})
        inflight.append((self._put(f"{prefix}a{i}", x.tobytes()), x.nbytes, f"{prefix}a{i}"))
        while sum(n for _, n, _ in inflight) > 256 << 20:  # bound the bytes copies in flight
          f, n, key = inflight.pop(0)
          result(f, self.url, f"writing {key}", n)
      for f, n, key in inflight:
        result(f, self.url, f"writing {key}", n)
    except BaseException:
      for f, _, _ in inflight:  # no write of this attempt may land after the failure
        settle(f)
      raise
    nbytes = sum(x.nbytes for x in leaves)
    body = {"format": "jaxrl_sys.weights/1", "version": v, "nbytes": nbytes,
            "checksum": "crc32", "chunk_bytes": weights_io.CHUNK_BYTES, "tree": tree,
            "arrays": arrays}
    if base is not None:
      body["base"] = base
    manifest = json.dumps(body).encode()
    result(self._put(f"{prefix}manifest.json", manifest), self.url,
           f"writing {prefix}manifest.json")
    return nbytes, zlib.crc32(manifest)

  def _discard(self, v: int) -> None:
    """Deletes what a failed publish wrote of version `v` (best effort: the failure itself, a
    full disk or a lost connection, is what gets reported)."""
    try:
      result(self._kv.delete_range(prefix_range(f"v{v}/")), self.url, f"deleting v{v}/")
      local = local_dir(self.url)
      if local is not None:
        os.rmdir(os.path.join(local, f"v{v}"))
    except Exception as e:  # pylint: disable=broad-except
      if not isinstance(e, FileNotFoundError):
        _log.warning("could not delete the partial weight version %d at %s: %s", v, self.url, e)
    with self._lock:
      self._orphans.add(v)  # the next gc tries again

  def published(self, version: int | None = None) -> TensorstoreWeightRef | None:
    with self._lock:
      if version is None:
        version = max(self._refs) if self._refs else None
      if version not in self._refs:
        return None
      ref = self._refs[version]
    if ref is None:  # committed before this store was opened: read its manifest once
      raw = read_key(self.url, f"v{version}/manifest.json")
      if raw is None:
        return None
      m = json.loads(raw)
      ref = TensorstoreWeightRef(self.url, version, int(m["nbytes"]), zlib.crc32(raw),
                                 _base_ref(self.url, m.get("base")))
      with self._lock:
        if version in self._refs:
          self._refs[version] = ref
    return ref

  def gc(self, in_use: Iterable[int]) -> list[int]:
    keep = set(int(v) for v in in_use)
    with self._lock:
      newest = max(self._refs) if self._refs else -1
      drop = [v for v in self._refs if v != newest and v not in keep]
      drop += [v for v in self._orphans if v < newest]
      for v in drop:
        self._refs.pop(v, None)
        self._orphans.discard(v)
    local = local_dir(self.url)
    for v in drop:  # manifest first: a reader then fails cleanly instead of half-reading
      result(self._kv.delete_range(prefix_range(f"v{v}/manifest.json")), self.url,
             f"deleting v{v}/manifest.json")
      result(self._kv.delete_range(prefix_range(f"v{v}/")), self.url, f"deleting v{v}/")
      if local is not None:
        try:
          os.rmdir(os.path.join(local, f"v{v}"))
        except OSError:
          pass
    return sorted(drop)

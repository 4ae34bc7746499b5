"""Pull-based weight store: the trainer publishes version v once and goes on; each worker pulls
the version it is told about (or the newest) itself, without blocking the trainer or the other
workers.

Two roles:
- the trainer side, a `WeightStore`: `publish(version, params, moe_state)` returns at once
  (slow backends write in the background); `ref(version)` gives a `WeightRef` once the version is
  committed; `gc(in_use)` drops versions no worker uses any more;
- the worker side, a `WeightRef`: small plain data that crosses processes inside
  `worker.Commands.load`; `ref.fetch()` pulls `(params, moe_state)` and verifies them.

Backends (see `make_weight_store`):
- `MemoryWeightStore`: the embedded default; the trainer's device arrays themselves (zero
  copy), so only workers in the trainer's process can use it.
- `TensorstoreWeightStore`: files under a directory or any tensorstore kvstore URL (`file://`,
  `gs://`, `memory://`), for workers on other machines; a worker that starts on its own finds the
  newest version with `open_latest(path)`.
- `rollout.ray_weights.RayWeightStore`: the Ray object store (objects die with the trainer).

Integrity: every array carries one zlib crc32 per `CHUNK_BYTES` slice, computed once at publish
and checked by every `fetch` (chunks are read and checked in parallel threads); a corrupt,
truncated, missing or half-deleted version raises `CorruptWeightsError` and is never returned.

Tensorstore layout of version v (a one-key write is atomic on every kvstore; many keys are not):
`v{v}/a{i}` the raw little-endian bytes of leaf i of `(params, moe_state)` in flatten order, then
`v{v}/manifest.json` (tree structure, leaf key paths, shapes, dtypes, checksums, total bytes),
then the one key `LATEST` (`{"version", "nbytes", "manifest_crc32"}`). A reader goes LATEST ->
manifest (checked against the crc32 it was committed with) -> arrays, so it never sees a
half-written version; `gc` deletes a manifest before its arrays, so a concurrent reader fails
cleanly.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import importlib
import json
import logging
import os
import re
import sys
import threading
import urllib.parse
import zlib
from typing import Any, Callable, Iterable, Protocol

import numpy as np

CHUNK_BYTES = 8 << 20  # one crc32 per 8 MiB of an array: one big array verifies in parallel
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

  def fetch(self) -> tuple[Any, Any]:
    """Pulls `(params, moe_state)` (host or device arrays); raises `CorruptWeightsError`."""


class WeightStore(Protocol):
  """The trainer's side of the store."""

  def publish(self, version: int, params: Any, moe_state: Any = None) -> None:
    """Makes `version` available; returns without waiting for slow writes."""

  def ref(self, version: int | None = None) -> WeightRef | None:
    """The reference of committed `version` (default: the newest), or None if not committed."""

  def latest(self) -> int | None:
    """The newest committed version (None before the first commit)."""

  def gc(self, in_use: Iterable[int]) -> list[int]:
    """Drops committed versions older than the newest that are not in `in_use`."""

  def wait(self) -> None:
    """Blocks until every publish so far is committed (re-raises a failed write)."""

  def close(self) -> None:
    """Waits, then releases resources (files stay)."""


def _nbytes(tree) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


class MemoryWeightRef:
  """A version held in this process's memory: `fetch` returns the arrays themselves."""

  def __init__(self, version: int, params: Any, moe_state: Any):
    self.version, self._tree = int(version), (params, moe_state)
    self.nbytes = _nbytes(self._tree)

  def fetch(self) -> tuple[Any, Any]:
    return self._tree

  def __reduce__(self):
    raise TypeError("the in-memory weight store only serves workers in the trainer's process; "
                    "use --weight_store=ray or --weight_store=tensorstore:PATH for Ray workers")


class MemoryWeightStore:
  """Versions kept as the published pytrees (zero copy). The arrays must not be donated or
  mutated after `publish` (the train step donates everything but the parameters)."""

  def __init__(self):
    self._refs: dict[int, MemoryWeightRef] = {}
    self._lock = threading.Lock()

  def publish(self, version: int, params: Any, moe_state: Any = None) -> None:
    with self._lock:
      if self._refs and version <= max(self._refs):
        raise ValueError(f"weight version {version} is not newer than {max(self._refs)}")
      self._refs[int(version)] = MemoryWeightRef(version, params, moe_state)

  def ref(self, version: int | None = None) -> MemoryWeightRef | None:
    with self._lock:
      if version is None:
        version = max(self._refs) if self._refs else None
      return self._refs.get(version)

  def latest(self) -> int | None:
    with self._lock:
      return max(self._refs) if self._refs else None

  def gc(self, in_use: Iterable[int]) -> list[int]:
    keep = set(int(v) for v in in_use)
    with self._lock:
      newest = max(self._refs) if self._refs else None
      drop = [v for v in self._refs if v != newest and v not in keep]
      for v in drop:
        del self._refs[v]
    return sorted(drop)

  def wait(self) -> None:
    return

  def close(self) -> None:
    return


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


def _parallel(tasks: list[Callable[[], None]], nbytes: list[int]) -> None:
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


def _bytes_view(x: np.ndarray) -> memoryview:
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
    out[i][k] = zlib.crc32(_bytes_view(leaves[i])[k * CHUNK_BYTES:(k + 1) * CHUNK_BYTES])
  idx = [(i, k) for i, c in enumerate(out) for k in range(len(c))]
  _parallel([lambda i=i, k=k: one(i, k) for i, k in idx],
            [min(CHUNK_BYTES, leaves[i].nbytes - k * CHUNK_BYTES) for i, k in idx])
  return out


def _check(got: int, want: int, where: str, version: int, path: str, k: int) -> None:
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
      _check(a, b, where, version, paths[i], k)


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
    except BaseException:
      _log.exception("publishing weight version %d (%s) failed", version, self._name)
      raise

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


# ----- tree structure as JSON (no pickle in shared files) ----------------------------------------
def _encode_tree(node: Any) -> Any:
  """The skeleton `jax.tree.unflatten(treedef, range(n))` as JSON; leaf i is `{"i": i}`."""
  if node is None:
    return {"t": "none"}
  if type(node) is int:  # pylint: disable=unidiomatic-typecheck
    return {"t": "leaf", "i": node}
  if type(node) is dict:  # pylint: disable=unidiomatic-typecheck
    if not all(isinstance(k, str) for k in node):
      raise TypeError(f"weight trees need string dict keys, got {list(node)[:4]}")
    return {"t": "dict", "k": list(node), "c": [_encode_tree(v) for v in node.values()]}
  if isinstance(node, tuple) and hasattr(type(node), "_fields"):
    cls = type(node)
    return {"t": "namedtuple", "cls": f"{cls.__module__}:{cls.__qualname__}",
            "c": [_encode_tree(v) for v in node]}
  if type(node) in (list, tuple):
    return {"t": type(node).__name__, "c": [_encode_tree(v) for v in node]}
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


def _decode_tree(enc: Any, leaves: list[Any]) -> Any:
  t = enc["t"]
  if t == "none":
    return None
  if t == "leaf":
    return leaves[enc["i"]]
  c = [_decode_tree(x, leaves) for x in enc["c"]]
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


# ----- tensorstore backend -----------------------------------------------------------------------
_KVSTORES: dict[str, Any] = {}


def _url(path_or_url: str | os.PathLike) -> str:
  path_or_url = os.fspath(path_or_url)
  if "://" not in path_or_url:
    return "file://" + urllib.parse.quote(os.path.abspath(path_or_url).rstrip("/")) + "/"
  return path_or_url if path_or_url.endswith("/") else path_or_url + "/"


def _kvstore(url: str):
  """One open kvstore per URL per process (so `memory://` is shared by a store and its refs)."""
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  with _POOL_LOCK:
    if url not in _KVSTORES:
      _KVSTORES[url] = ts.KvStore.open(url).result()
    return _KVSTORES[url]


def _local_dir(url: str) -> str | None:
  """The directory of a `file://` URL (read with plain file calls: no tensorstore start-up)."""
  return urllib.parse.unquote(url[len("file://"):]) if url.startswith("file://") else None


def _read_key(url: str, key: str) -> bytes | None:
  """One small value (None if missing)."""
  local = _local_dir(url)
  if local is None:
    got = _kvstore(url).read(key).result()
    return got.value if got.state == "value" else None
  try:
    with open(os.path.join(local, key), "rb") as f:
      return f.read()
  except FileNotFoundError:
    return None


def _prefix_range(prefix: str):
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


@dataclasses.dataclass(frozen=True)
class TensorstoreWeightRef:
  """Committed version `version` under `url`: plain data, pickles anywhere.

  Attributes:
    url: the kvstore URL of the store's root (ends with "/").
    version, nbytes: the version and the total bytes of its arrays.
    manifest_crc32: crc32 of the committed manifest (a replaced manifest is refused).
  """
  url: str
  version: int
  nbytes: int
  manifest_crc32: int

  def fetch(self) -> tuple[Any, Any]:
    """Reads and verifies `(params, moe_state)` as host numpy arrays (bfloat16 via ml_dtypes).

    Raises:
      CorruptWeightsError: manifest or array missing, truncated, or failing its crc32.
    """
    v, where = self.version, self.url
    raw = _read_key(self.url, f"v{v}/manifest.json")
    if raw is None:
      raise CorruptWeightsError(f"weight version {v} at {where}: manifest.json is missing "
                                "(deleted by gc, or never committed)")
    if zlib.crc32(raw) != self.manifest_crc32:
      raise CorruptWeightsError(f"weight version {v} at {where}: manifest.json fails its crc32")
    try:
      m = json.loads(raw)
      arrays = [(a["path"], f"v{v}/{a['key']}", tuple(a["shape"]), dtype_from_name(a["dtype"]),
                 a["crc32"]) for a in m["arrays"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise CorruptWeightsError(f"weight version {v} at {where}: bad manifest ({e})") from e
    local = _local_dir(self.url)
    leaves = (_read_files(local, arrays, v, where) if local is not None
              else _read_kvstore(_kvstore(self.url), arrays, v, where))
    try:
      return _decode_tree(m["tree"], leaves)
    except (ValueError, KeyError, TypeError, IndexError, ImportError, AttributeError) as e:
      raise CorruptWeightsError(f"weight version {v} at {where}: bad tree in manifest ({e})") from e


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
      if len(crcs) != -(-buf.nbytes // CHUNK_BYTES):
        raise CorruptWeightsError(f"weight version {v} at {where}: the manifest lists "
                                  f"{len(crcs)} checksums for the {size} bytes of {path}")
      for k, want in enumerate(crcs):
        tasks.append(lambda fd=fds[-1], mv=_bytes_view(buf), k=k, want=want, path=path:
                     _read_chunk(fd, mv, k, want, v, where, path))
        sizes.append(min(CHUNK_BYTES, size - k * CHUNK_BYTES))
    _parallel(tasks, sizes)
  finally:
    for fd in fds:
      os.close(fd)
  return bufs


def _read_chunk(fd: int, mv: memoryview, k: int, want: int, v: int, where: str, path: str):
  part = mv[k * CHUNK_BYTES:(k + 1) * CHUNK_BYTES]
  n = os.preadv(fd, [part], k * CHUNK_BYTES)
  if n != len(part):
    raise _size_error(v, where, path, k * CHUNK_BYTES + n, len(mv))
  _check(zlib.crc32(part), want, where, v, path, k)


def _read_kvstore(kv, arrays, v: int, where: str) -> list[np.ndarray]:
  """Any other kvstore: read every key concurrently, then verify in parallel."""
  futures = [kv.read(key) for _, key, _, _, _ in arrays]
  leaves = []
  for (path, _, shape, dtype, _), f in zip(arrays, futures):
    got = f.result()
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if got.state != "value":
      raise CorruptWeightsError(f"weight version {v} at {where}: array {path} is missing "
                                "(deleted by gc, or never written)")
    if len(got.value) != want:
      raise _size_error(v, where, path, len(got.value), want)
    leaves.append(np.frombuffer(got.value, dtype).reshape(shape))
  verify_leaves(leaves, [a[4] for a in arrays], [a[0] for a in arrays], v, where)
  return leaves


def _read_latest(url: str) -> TensorstoreWeightRef | None:
  raw = _read_key(url, "LATEST")
  if raw is None:
    return None
  try:
    p = json.loads(raw)
    return TensorstoreWeightRef(url, int(p["version"]), int(p["nbytes"]), int(p["manifest_crc32"]))
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptWeightsError(f"{url}LATEST is not a weight pointer ({e}): {raw[:80]!r}") from e


def open_latest(path_or_url: str | os.PathLike) -> TensorstoreWeightRef | None:
  """The newest committed version under `path_or_url` (a directory or kvstore URL), or None
  before the first commit: what a worker that starts on its own calls."""
  return _read_latest(_url(path_or_url))


class TensorstoreWeightStore:
  """Versions written under a directory or tensorstore kvstore URL (see the module docstring).

  `publish` takes a host copy synchronously and writes in the background; `ref(v)` is None until
  v's `LATEST` pointer is written. Opening an existing root resumes it: committed versions are
  listed, and half-written ones (a crashed publish) are deleted by the next `gc`.

  Args:
    path_or_url: a local directory, or a kvstore URL (`file:///d/`, `gs://bucket/run/`, ...).
    max_pending: host copies allowed to wait for writing before `publish` blocks.
  """

  def __init__(self, path_or_url: str | os.PathLike, *, max_pending: int = 2):
    self.url = _url(path_or_url)
    self._kv = _kvstore(self.url)
    self._lock = threading.Lock()
    latest = _read_latest(self.url)
    dirs: dict[int, bool] = {}
    for key in self._kv.list().result():
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
    self._bg.last = top

  def publish(self, version: int, params: Any, moe_state: Any = None) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    leaves, treedef = host_leaves(params, moe_state)
    tree = _encode_tree(jax.tree.unflatten(treedef, list(range(len(leaves)))))
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(treedef, leaves))[0]]
    self._bg.submit(int(version), lambda: self._write(int(version), leaves, tree, paths))

  def _put(self, key: str, value: bytes):
    """One kvstore write (a future); tests replace it to simulate a crash."""
    return self._kv.write(key, value)

  def _write(self, v: int, leaves: list[np.ndarray], tree: Any, paths: list[str]) -> None:
    self._kv.delete_range(_prefix_range(f"v{v}/")).result()  # leftovers of a crashed attempt
    arrays, inflight = [], []
    try:
      for i, (x, path) in enumerate(zip(leaves, paths)):
        crcs = [zlib.crc32(_bytes_view(x)[o:o + CHUNK_BYTES])
                for o in range(0, x.nbytes, CHUNK_BYTES)]
        arrays.append({"key": f"a{i}", "path": path, "shape": list(x.shape),
                       "dtype": x.dtype.name, "nbytes": x.nbytes, "crc32": crcs})
        inflight.append((self._put(f"v{v}/a{i}", x.tobytes()), x.nbytes))
        while sum(n for _, n in inflight) > 256 << 20:  # bound the bytes copies in flight
          inflight.pop(0)[0].result()
      for f, _ in inflight:
        f.result()
    except BaseException:
      for f, _ in inflight:  # no write of this attempt may land after the failure is reported
        f.exception()
      raise
    nbytes = sum(x.nbytes for x in leaves)
    manifest = json.dumps({"format": "jaxrl_sys.weights/1", "version": v, "nbytes": nbytes,
                           "checksum": "crc32", "chunk_bytes": CHUNK_BYTES, "tree": tree,
                           "arrays": arrays}).encode()
    self._put(f"v{v}/manifest.json", manifest).result()
    ref = TensorstoreWeightRef(self.url, v, nbytes, zlib.crc32(manifest))
    self._put("LATEST", json.dumps({"version": v, "nbytes": nbytes,
                                    "manifest_crc32": ref.manifest_crc32}).encode()).result()
    with self._lock:
      self._refs[v] = ref
      self._orphans.discard(v)

  def ref(self, version: int | None = None) -> TensorstoreWeightRef | None:
    with self._lock:
      if version is None:
        version = max(self._refs) if self._refs else None
      if version not in self._refs:
        return None
      ref = self._refs[version]
    if ref is None:  # committed before this store was opened: read its manifest once
      raw = _read_key(self.url, f"v{version}/manifest.json")
      if raw is None:
        return None
      ref = TensorstoreWeightRef(self.url, version, int(json.loads(raw)["nbytes"]),
                                 zlib.crc32(raw))
      with self._lock:
        if version in self._refs:
          self._refs[version] = ref
    return ref

  def latest(self) -> int | None:
    with self._lock:
      return max(self._refs) if self._refs else None

  def gc(self, in_use: Iterable[int]) -> list[int]:
    keep = set(int(v) for v in in_use)
    with self._lock:
      newest = max(self._refs) if self._refs else -1
      drop = [v for v in self._refs if v != newest and v not in keep]
      drop += [v for v in self._orphans if v < newest]
      for v in drop:
        self._refs.pop(v, None)
        self._orphans.discard(v)
    local = _local_dir(self.url)
    for v in drop:  # manifest first: a reader then fails cleanly instead of half-reading
      self._kv.delete_range(_prefix_range(f"v{v}/manifest.json")).result()
      self._kv.delete_range(_prefix_range(f"v{v}/")).result()
      if local is not None:
        try:
          os.rmdir(os.path.join(local, f"v{v}"))
        except OSError:
          pass
    return sorted(drop)

  def wait(self) -> None:
    self._bg.wait()

  def close(self) -> None:
    self._bg.close()


def make_weight_store(spec: str) -> WeightStore:
  """A weight store from a flag value: "memory", "ray", or "tensorstore:PATH_OR_URL" (e.g.
  "tensorstore:/scratch/run1/weights", "tensorstore:gs://bucket/run1/weights")."""
  if spec == "memory":
    return MemoryWeightStore()
  if spec == "ray":
    from jaxrl_sys.rollout import ray_weights  # pylint: disable=import-outside-toplevel
    return ray_weights.RayWeightStore()
  if spec.startswith("tensorstore:") and spec[len("tensorstore:"):]:
    return TensorstoreWeightStore(spec[len("tensorstore:"):])
  raise ValueError(f"unknown weight store {spec!r}: use 'memory', 'ray' or "
                   "'tensorstore:PATH_OR_URL' (a directory, file://, gs:// or memory:// URL)")

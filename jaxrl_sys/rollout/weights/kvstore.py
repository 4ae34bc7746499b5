"""Tensorstore kvstore access for the tensorstore weight store (`weights.tensorstore`), every
operation with a deadline: one open kvstore per URL per process, small reads, key ranges.

Tensorstore itself retries an endpoint it cannot reach (e.g. `gs://` without credentials or
network) for many minutes, so every operation waits at most `REMOTE_TIMEOUT_S` for a small one,
plus `MIN_BYTES_PER_S` for a data write or read; past it, `result` raises
`WeightStoreUnreachableError`. `file://` roots are read with plain file calls (`local_dir`,
`read_key`): no tensorstore start-up.
"""
from __future__ import annotations

import os
import threading
import urllib.parse
from typing import Any

# Deadline of one small kvstore operation (open, list, a pointer or a manifest), in seconds; data
# transfers get `nbytes / MIN_BYTES_PER_S` more.
REMOTE_TIMEOUT_S = 60.0
MIN_BYTES_PER_S = 4 << 20


class WeightStoreUnreachableError(ValueError):
  """The weight store's kvstore did not answer within its deadline (no network, credentials,
  or a hung mount)."""


def result(future, url: str, what: str, nbytes: int = 0):
  """`future.result()` within the deadline of an operation moving `nbytes` (see the module
  docstring); raises `WeightStoreUnreachableError` past it."""
  timeout = REMOTE_TIMEOUT_S + nbytes / MIN_BYTES_PER_S
  try:
    return future.result(timeout=timeout)
  except TimeoutError:
    try:
      future.cancel()
    except Exception:  # pylint: disable=broad-except  (best effort)
      pass
    hint = (" (gs:// needs credentials: GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth "
            "application-default login`)" if url.startswith("gs://") else "")
    raise WeightStoreUnreachableError(
        f"the weight store {url} did not answer within {timeout:.3g} s ({what}): is it "
        f"reachable from here{hint}? Check the URL, the network and its credentials, or use a "
        "local directory (--weight_store=tensorstore:/path)") from None


_KVSTORES: dict[str, Any] = {}
_KV_LOCK = threading.Lock()


def root_url(path_or_url: str | os.PathLike) -> str:
  path_or_url = os.fspath(path_or_url)
  if "://" not in path_or_url:
    return "file://" + urllib.parse.quote(os.path.abspath(path_or_url).rstrip("/")) + "/"
  return path_or_url if path_or_url.endswith("/") else path_or_url + "/"


def open_kvstore(url: str):
  """One open kvstore per URL per process (so `memory://` is shared by a store and its refs)."""
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  with _KV_LOCK:
    if url not in _KVSTORES:
      _KVSTORES[url] = result(ts.KvStore.open(url), url, "opening it")
    return _KVSTORES[url]


def local_dir(url: str) -> str | None:
  """The directory of a `file://` URL (read with plain file calls: no tensorstore start-up)."""
  return urllib.parse.unquote(url[len("file://"):]) if url.startswith("file://") else None


def read_key(url: str, key: str) -> bytes | None:
  """One small value (None if missing)."""
  local = local_dir(url)
  if local is None:
    got = result(open_kvstore(url).read(key), url, f"reading {key}")
    return got.value if got.state == "value" else None
  try:
    with open(os.path.join(local, key), "rb") as f:
      return f.read()
  except FileNotFoundError:
    return None


def settle(future) -> None:
  """Waits (within the deadline) for a write whose attempt failed, ignoring its outcome."""
  try:
    future.exception(timeout=REMOTE_TIMEOUT_S)
  except Exception:  # pylint: disable=broad-except  (a timeout, a cancelled future)
    pass


def prefix_range(prefix: str):
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))

"""Minimal safetensors reader/writer on numpy (bf16 via ml_dtypes), incl. sharded indexes.

Format: 8-byte little-endian header length, a JSON header mapping names to
{dtype, shape, data_offsets}, then the raw little-endian tensor bytes.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

_TO_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}
_FROM_NP = {np.dtype(v): k for k, v in _TO_NP.items()}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class SafetensorsError(ValueError):
  """A .safetensors file that is truncated or malformed (the message names the file)."""


def _header(path: str, data: bytes) -> tuple[dict, int]:
  """(header dict, offset of the tensor bytes); SafetensorsError naming `path` when the file is
  too short or its header is not a JSON object."""
  if len(data) < 8:
    raise SafetensorsError(f"{path}: truncated ({len(data)} bytes; a safetensors file starts "
                           "with an 8-byte header length)")
  (n,) = struct.unpack("<Q", data[:8])
  if 8 + n > len(data):
    raise SafetensorsError(f"{path}: truncated or not a safetensors file (header of {n} bytes, "
                           f"file of {len(data)})")
  try:
    header = json.loads(data[8:8 + n])
  except ValueError as e:
    raise SafetensorsError(f"{path}: unreadable header ({e})") from None
  if not isinstance(header, dict):
    raise SafetensorsError(f"{path}: the header is not a JSON object")
  return header, 8 + n


def read_file(path: str) -> dict[str, np.ndarray]:
  """Reads every tensor of one .safetensors file.

  Raises:
    SafetensorsError: a truncated or malformed file (named, with the offending tensor).
  """
  with open(path, "rb") as f:
    data = f.read()
  header, base = _header(path, data)
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
      raise SafetensorsError(f"{path}: tensor {name!r} has a malformed header entry {info!r:.200}"
                             ) from None
    if dtype not in _TO_NP:
      raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
    dt = np.dtype(_TO_NP[dtype])
    want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if end - start != want or start < 0:
      raise SafetensorsError(f"{path}: tensor {name!r} {dtype}{list(shape)} needs {want} bytes, "
                             f"its offsets span {end - start}")
    if base + end > len(data):
      raise SafetensorsError(f"{path}: truncated: tensor {name!r} ends at byte {base + end}, the "
                             f"file has {len(data)} bytes (re-download or re-save it)")
    arr = np.frombuffer(data, dtype=dt, count=want // dt.itemsize, offset=base + start)
    out[name] = arr.reshape(shape).copy()
  return out


def write_file(path: str, tensors: Mapping[str, np.ndarray],
               metadata: Mapping[str, str] | None = None):
  """Writes tensors (numpy arrays) to one .safetensors file, names sorted."""
  header, chunks, offset = {}, [], 0
  for name in sorted(tensors):
    arr = np.ascontiguousarray(tensors[name])
    if arr.dtype not in _FROM_NP:
      raise ValueError(f"tensor {name!r} has unsupported dtype {arr.dtype}")
    raw = arr.tobytes()
    header[name] = {"dtype": _FROM_NP[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + len(raw)]}
    chunks.append(raw)
    offset += len(raw)
  header["__metadata__"] = dict(metadata or {"format": "pt"})
  hbytes = json.dumps(header, separators=(",", ":")).encode()
  hbytes += b" " * (-len(hbytes) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(hbytes)))
    f.write(hbytes)
    for c in chunks:
      f.write(c)


def read_checkpoint(directory: str) -> dict[str, np.ndarray]:
  """Reads `model.safetensors` or every shard named in `model.safetensors.index.json`."""
  index = os.path.join(directory, INDEX_NAME)
  if os.path.exists(index):
    try:
      with open(index, encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
    out = {}
    for shard in sorted(set(weight_map.values())):
      if not os.path.isfile(os.path.join(directory, shard)):
        raise ValueError(f"{index} names the shard {shard}, which is not in {directory}")
      out.update(read_file(os.path.join(directory, shard)))
    missing = sorted(set(weight_map) - set(out))
    if missing:
      raise ValueError(f"{directory}: tensors listed in {INDEX_NAME} but absent from shards: "
                       f"{missing[:10]}")
    return out
  single = os.path.join(directory, SINGLE_NAME)
  if os.path.exists(single):
    return read_file(single)
  files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
  if not files:
    raise FileNotFoundError(f"no *.safetensors files (or {INDEX_NAME}) in {directory}")
  out = {}
  for f in files:
    out.update(read_file(os.path.join(directory, f)))
  return out


def write_checkpoint(directory: str, tensors: Mapping[str, np.ndarray],
                     max_shard_bytes: int = 2 << 30):
  """Writes one file, or numbered shards plus an index when larger than `max_shard_bytes`."""
  os.makedirs(directory, exist_ok=True)
  total = sum(int(t.nbytes) for t in tensors.values())
  if total <= max_shard_bytes:
    write_file(os.path.join(directory, SINGLE_NAME), tensors)
    return
  shards, cur, size = [], {}, 0
  for name in sorted(tensors):
    if cur and size + tensors[name].nbytes > max_shard_bytes:
      shards.append(cur)
      cur, size = {}, 0
    cur[name] = tensors[name]
    size += tensors[name].nbytes
  shards.append(cur)
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    write_file(os.path.join(directory, fname), shard)
    weight_map.update({k: fname for k in shard})
  with open(os.path.join(directory, INDEX_NAME), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

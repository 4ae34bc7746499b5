"""Plain-data wire format of rollout records: arrays as base64 of little-endian bytes with their
dtype and shape, requests as JSON-ready dicts (exact, no pickles).

Used wherever rollout state leaves a process as text: checkpoints of the trainer's rollout buffer
and of the manager's in-flight token state.
"""
from __future__ import annotations

import base64

import numpy as np

from jaxrl_sys.rollout.types import Request


def encode_array(x: np.ndarray) -> dict:
  """`{"dtype", "shape", "data"}` (base64 bytes) of `x`; exact round trip by `decode_array`."""
  x = np.ascontiguousarray(x)
  return {"dtype": x.dtype.str, "shape": list(x.shape),
          "data": base64.b64encode(x.tobytes()).decode("ascii")}


def decode_array(d: dict) -> np.ndarray:
  """Inverse of `encode_array`; object dtypes are refused."""
  dtype = np.dtype(d["dtype"])
  if dtype.hasobject:
    raise ValueError("object arrays are not allowed in a checkpoint")
  raw = base64.b64decode(d["data"].encode("ascii"))
  return np.frombuffer(raw, dtype).reshape(d["shape"]).copy()


def request_to_json(r: Request) -> dict:
  """A `Request` with its token-level state (and its MoE routes, when recorded) as a JSON-ready
  dict."""
  out = {"request_id": int(r.request_id), "max_new_tokens": int(r.max_new_tokens),
         "group_id": int(r.group_id), "min_version": int(r.min_version), "meta": r.meta,
         "prompt": encode_array(r.prompt), "key": encode_array(r.key),
         "tokens": encode_array(r.tokens), "logprobs": encode_array(r.logprobs),
         "versions": encode_array(r.versions)}
  if r.routes is not None:
    out["routes"] = encode_array(r.routes)
  return out


def request_from_json(d: dict) -> Request:
  """Inverse of `request_to_json`."""
  return Request(request_id=d["request_id"], prompt=decode_array(d["prompt"]),
                 max_new_tokens=d["max_new_tokens"], key=decode_array(d["key"]),
                 group_id=d["group_id"], tokens=decode_array(d["tokens"]),
                 logprobs=decode_array(d["logprobs"]), versions=decode_array(d["versions"]),
                 min_version=d["min_version"], meta=dict(d["meta"]),
                 routes=decode_array(d["routes"]) if "routes" in d else None)

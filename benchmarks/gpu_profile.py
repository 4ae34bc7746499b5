"""Where the time goes: a `jax.profiler` trace of warm calls, summed per op name.

    rows = profile_ops(lambda: fn(*args), calls=3, out_dir="/tmp/trace")
    rows, totals = profile_summary(lambda: fn(*args), calls=3)   # + totals over all ops

The trace's events (`*.trace.json.gz`) are summed by name over the device's process
("/device:GPU:0" on a GPU; the host process where there is no device process, as on CPU), so
copies (`memcpy*`), GEMMs and fusions show up with their share of device time and their count.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import tempfile

import jax


def _events(trace_dir: str) -> list[dict]:
  files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz")))
  if not files:
    raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}/plugins/profile")
  with gzip.open(files[-1]) as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


# Op names that move bytes without arithmetic: copies (XLA's `copy*` fusions, CUDA memcpy) and
# in-place slice writes (a KV-cache write is a dynamic-update-slice).
COPY_MARKERS = ("copy", "memcpy", "memset")
UPDATE_MARKERS = ("dynamic-update-slice", "dynamic_update_slice")


def _per_op(events: list[dict]):
  names = {e["pid"]: e.get("args", {}).get("name", "")
           for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
  device = {pid for pid, n in names.items() if "/device:" in n}
  pids = device or set(names) or {e.get("pid") for e in events}
  total, count = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in pids:
      total[e["name"]] += float(e.get("dur", 0.0))
      count[e["name"]] += 1
  return total, count, bool(device)


def summarize(events: list[dict], calls: int, top: int = 25) -> list[dict]:
  """Per-op totals of complete ("X") events on the device process(es), else on the host.

  Returns rows {op, process, ms_per_call, count_per_call, share} sorted by time, `top` of them.
  """
  total, count, device = _per_op(events)
  whole = sum(total.values()) or 1.0
  return [{"op": name, "process": "device" if device else "host",
           "ms_per_call": us / 1e3 / calls, "count_per_call": count[name] / calls,
           "share": us / whole} for name, us in total.most_common(top)]


def totals(events: list[dict], calls: int) -> dict:
  """Over all ops (as `summarize` picks them): ms and op (kernel) count per call, and the
  share of that time in copies (`COPY_MARKERS`) and in dynamic-update-slices."""
  total, count, device = _per_op(events)
  whole = sum(total.values()) or 1.0
  share = lambda marks: sum(us for n, us in total.items()  # noqa: E731
                            if any(m in n.lower() for m in marks)) / whole
  return {"process": "device" if device else "host", "ms_per_call": whole / 1e3 / calls,
          "count_per_call": sum(count.values()) / calls, "copy_share": share(COPY_MARKERS),
          "update_slice_share": share(UPDATE_MARKERS)}


def profile_summary(fn, calls: int = 3, out_dir: str | None = None,
                    top: int = 25) -> tuple[list[dict], dict]:
  """Runs `fn()` once to warm up, then `calls` times under a trace: (`summarize`, `totals`)."""
  jax.block_until_ready(fn())
  out_dir = out_dir or tempfile.mkdtemp(prefix="jaxrl_trace_")
  jax.profiler.start_trace(out_dir, create_perfetto_trace=True)
  try:
    for _ in range(calls):
      jax.block_until_ready(fn())
  finally:
    jax.profiler.stop_trace()
  events = _events(out_dir)
  return summarize(events, calls, top), totals(events, calls)


def profile_ops(fn, calls: int = 3, out_dir: str | None = None, top: int = 25) -> list[dict]:
  """The per-op rows of `profile_summary`."""
  return profile_summary(fn, calls, out_dir, top)[0]

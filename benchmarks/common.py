"""Shared helpers for the benchmark scripts: timing, tables, JSON output."""
from __future__ import annotations

import json
import os
import platform
import time
from typing import Callable, Sequence

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def timeit(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
  """Best wall time in seconds of `fn()` over `repeats` runs after `warmup` runs."""
  for _ in range(warmup):
    fn()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def print_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
  columns = list(columns or rows[0].keys())
  fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
  widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in columns]
  lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths)),
           "-+-".join("-" * w for w in widths)]
  lines += [" | ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)) for r in rows]
  text = "\n".join(lines)
  print(text)
  return text


def write_json(name: str, payload: dict) -> str:
  """Writes `payload` (plus machine info) to benchmarks/results/<name>.json; returns the path."""
  import jax  # pylint: disable=import-outside-toplevel
  os.makedirs(RESULTS_DIR, exist_ok=True)
  payload = dict(payload)
  payload["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "jax": jax.__version__, "backend": jax.default_backend(),
                        "devices": [str(d) for d in jax.devices()[:4]]}
  path = os.path.join(RESULTS_DIR, f"{name}.json")
  with open(path, "w") as f:
    json.dump(payload, f, indent=2)
  print(f"wrote {path}")
  return path

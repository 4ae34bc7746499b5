"""Elastic-rollout benchmarks, one function per part (`--part`, default: every part).

(a) New-worker ready time vs weight bytes. For transformer-shaped float32 masters of about
    `--sizes_mb` MB, each rollout dtype (`--rollout_dtypes`: the masters published as they are,
    or cast to bfloat16 first, as `train.precision.rollout_weights` does in the loop) and each
    weight store backend (tensorstore on a local directory; the Ray object store), measures the
    bytes published, the trainer's publish (the cast plus the blocking host copy, and the total
    until committed), then the first `fetch` (read + crc32 check of every chunk)
    in a fresh reader process (a subprocess; a new Ray actor), against a raw copy of the same
    bytes in another fresh process (plain `open().readinto` of the same files into new buffers;
    `ray.get` of one bytes blob of the same size, no checks). Target: fetch within 2x of raw.
    Imports are done before the clock starts in both. Files are in the page cache (just
    written), so this is the memory-bound case, where checking costs the most relative to I/O.

(b), (c): see `benchmarks/elastic_rollout.py`.

Results go to benchmarks/results/elastic.json, a dict keyed by part.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks.common import RESULTS_DIR, print_table, write_json  # noqa: E402

_TS_READER = """
import json, sys, time
import ml_dtypes, numpy, tensorstore
from jaxrl_sys.rollout.weights.tensorstore import TensorstoreWeightRef
ref = TensorstoreWeightRef(**json.loads(sys.argv[1]))
t = time.perf_counter()
ref.load()
print(json.dumps(time.perf_counter() - t))
"""
_RAW_READER = """
import json, sys, time
import numpy as np
files = json.loads(sys.argv[1])
t = time.perf_counter()
bufs = [np.empty(n, np.uint8) for _, n in files]
for (name, n), buf in zip(files, bufs):
  with open(name, "rb", buffering=0) as f:
    assert f.readinto(buf) == n
print(json.dumps(time.perf_counter() - t))
"""


def transformer_params(nbytes: int, layers: int = 4):
  """Dense-transformer-shaped float32 masters of about `nbytes`: hidden H (a multiple of 16),
  vocab 4H, MLP 3H; `[H, H]`/`[H, 3H]`/`[3H, H]`/`[4H, H]` matrices and `[H]` norms, as jax
  arrays (what the trainer holds)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  h = max(64, int(round((nbytes / (4 * (4 + 13 * layers))) ** 0.5 / 16)) * 16)
  key = iter(jax.random.split(jax.random.PRNGKey(0), 16 * layers + 2))
  mat = lambda *s: jax.random.normal(next(key), s, jnp.float32)  # noqa: E731
  params = {"embed": mat(4 * h, h), "final_norm": jnp.ones((h,), jnp.float32), "layers": [
      {"attn": {"q": mat(h, h), "k": mat(h, h), "v": mat(h, h), "o": mat(h, h)},
       "mlp": {"gate": mat(h, 3 * h), "up": mat(h, 3 * h), "down": mat(3 * h, h)},
       "norm1": jnp.ones((h,), jnp.float32), "norm2": jnp.ones((h,), jnp.float32)}
      for _ in range(layers)]}
  return jax.block_until_ready(params)


def checksum_throughput(nbytes: int = 64 << 20) -> dict:
  """GiB/s of candidate checksums over `nbytes` of random float32 on this machine (best of 3)."""
  from jaxrl_sys.rollout.weights import io as weights_io  # pylint: disable=import-outside-toplevel
  x = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
  mv = memoryview(x).cast("B")
  cands = {"zlib.crc32 (1 thread)": lambda: zlib.crc32(mv),
           "weights_io.chunk_crcs (all cores)": lambda: weights_io.chunk_crcs([x]),
           "hashlib.sha256": lambda: hashlib.sha256(mv).digest(),
           "hashlib.blake2b": lambda: hashlib.blake2b(mv).digest(),
           "numpy uint64 sum (weak)": lambda: x.view(np.uint64).sum(),
           "memcpy (reference)": lambda: np.copyto(np.empty_like(x), x)}
  out = {}
  for name, fn in cands.items():
    fn()
    best = min(_timed(fn) for _ in range(3))
    out[name] = round(nbytes / best / 2**30, 2)
  return out


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def _subprocess_seconds(code: str, arg) -> float:
  out = subprocess.run([sys.executable, "-c", code, json.dumps(arg)], check=True,
                       capture_output=True, text=True, cwd=REPO)
  return float(out.stdout.strip().splitlines()[-1])


def _publish(store, params, version: int, rollout_dtype: str) -> tuple[float, float]:
  from jaxrl_sys.train.precision import rollout_weights  # pylint: disable=import-outside-toplevel
  t = time.perf_counter()
  store.publish(rollout_weights(params, rollout_dtype), version, None)
  block = time.perf_counter() - t
  store.wait()
  return block, time.perf_counter() - t


def _tensorstore_row(params, dtype: str, repeats: int, root: str) -> dict:
  from jaxrl_sys.rollout.weights import tensorstore as ts_weights  # pylint: disable=import-outside-toplevel
  store = ts_weights.TensorstoreWeightStore(root)
  pubs = [_publish(store, params, v, dtype) for v in range(1, repeats + 1)]
  store.gc(in_use=[])
  ref = store.published()
  with open(os.path.join(root, f"v{ref.version}", "manifest.json")) as f:
    files = [(os.path.join(root, f"v{ref.version}", a["key"]), a["nbytes"])
             for a in json.load(f)["arrays"]]
  fetch, raw = [], []
  for _ in range(repeats):  # alternate, each in a fresh process
    fetch.append(_subprocess_seconds(_TS_READER, dataclasses.asdict(ref)))
    raw.append(_subprocess_seconds(_RAW_READER, files))
  store.close()
  return _row("tensorstore (local dir)", dtype, ref_bytes(params), ref.nbytes, pubs, fetch, raw)


def _ray_rows(sizes: list[int], dtypes: list[str], repeats: int) -> list[dict]:
  import ray  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.weights import ray as ray_weights  # pylint: disable=import-outside-toplevel
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
           object_store_memory=max(1 << 30, 4 * max(sizes)))

  @ray.remote(num_cpus=0)
  class FreshReader:
    """A new worker: imports first, then pulls once."""

    def __init__(self):
      import jax  # noqa: F401  pylint: disable=unused-import
      import jaxrl_sys.rollout.weights.ray  # noqa: F401  pylint: disable=unused-import

    def fetch(self, box) -> float:
      return _timed(box["ref"].load)

    def raw(self, box) -> float:
      return _timed(lambda: ray.get(box["blob"]))

  rows = []
  for nbytes, dtype in [(n, d) for n in sizes for d in dtypes]:
    params = transformer_params(nbytes)
    store = ray_weights.RayWeightStore()
    pubs = [_publish(store, params, v, dtype) for v in range(1, repeats + 1)]
    store.gc(in_use=[])
    ref = store.published()
    blob = ray.put(np.random.default_rng(0).bytes(ref.nbytes))
    fetch, raw = [], []
    for _ in range(repeats):
      for kind, out in (("fetch", fetch), ("raw", raw)):
        actor = FreshReader.remote()
        out.append(ray.get(getattr(actor, kind).remote({"ref": ref, "blob": blob})))
        ray.kill(actor)
    store.close()
    rows.append(_row("ray object store", dtype, ref_bytes(params), ref.nbytes, pubs, fetch, raw))
    del store, ref, blob
  ray.shutdown()
  return rows


def ref_bytes(params) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  return int(sum(x.nbytes for x in jax.tree.leaves(params)))


def _row(backend: str, dtype: str, master_bytes: int, nbytes: int, pubs, fetch, raw) -> dict:
  """One measurement: `master_bytes` of float32 masters published as `nbytes` of `dtype`."""
  med = statistics.median
  f, r = med(fetch), med(raw)
  return {"backend": backend, "rollout_dtype": dtype,
          "masters_MB": round(master_bytes / 1e6, 1), "MB": round(nbytes / 1e6, 1),
          "publish_block_ms": 1e3 * med(p[0] for p in pubs),
          "publish_total_ms": 1e3 * med(p[1] for p in pubs),
          "fetch_ms": 1e3 * f, "raw_copy_ms": 1e3 * r, "fetch/raw": f / r,
          "fetch_GBps": nbytes / f / 1e9, "within_2x": bool(f <= 2 * r)}


def part_a(args) -> dict:
  """New-worker ready time vs weight bytes (see the module docstring)."""
  sizes = [int(float(s) * 1e6) for s in args.sizes_mb.split(",")]
  dtypes = args.rollout_dtypes.split(",")
  rows = []
  with tempfile.TemporaryDirectory(prefix="elastic_a_", dir=args.tmp_dir) as tmp:
    for nbytes in sizes:
      params = transformer_params(nbytes)
      for dtype in dtypes:
        rows.append(_tensorstore_row(params, dtype, args.repeats,
                                     os.path.join(tmp, f"ts{nbytes}-{dtype}")))
  if not args.skip_ray:
    rows += _ray_rows(sizes, dtypes, args.repeats)
  print("\n(a) new-worker ready time: first verified fetch in a fresh process vs a raw copy "
        f"(median of {args.repeats})")
  table = print_table(rows)
  checks = checksum_throughput()
  print("\nchecksum throughput, GiB/s:", json.dumps(checks))
  ok = all(r["within_2x"] for r in rows)
  print(f"2x target {'holds' if ok else 'FAILS'} for every size and backend" if ok else
        "2x target FAILS for: " + ", ".join(f"{r['backend']} {r['MB']} MB" for r in rows
                                            if not r["within_2x"]))
  return {"rows": rows, "table": table, "checksum_GiBps": checks, "within_2x_all": ok,
          "cpus": os.cpu_count()}


def _b(args) -> dict:
  from benchmarks.elastic_rollout import part_b  # pylint: disable=import-outside-toplevel
  out = part_b(args)
  print(f"\n(b) one preemption of 2 Ray workers: generation-phase overhead, token migration vs "
        f"restart-from-prompt (undisturbed {out['undisturbed_s']:.2f} s, median of "
        f"{args.repeats})")
  out["table"] = print_table(out["rows"])
  return out


def _c(args) -> dict:
  from benchmarks.elastic_rollout import part_c  # pylint: disable=import-outside-toplevel
  out = part_c(args)
  print(f"\n(c) rollout throughput, {args.c_requests} requests x {args.c_max_new} tokens "
        f"(median of {args.repeats})")
  out["table"] = print_table(out["rows"])
  return out


PARTS = {"a": part_a, "b": _b, "c": _c}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--part", choices=sorted(PARTS), action="append",
                  help="part(s) to run (repeatable); default: all")
  ap.add_argument("--sizes_mb", default="4,16,64,256", help="(a) weight sizes, MB")
  ap.add_argument("--repeats", type=int, default=3,
                  help="repeats per measurement (median): fresh readers (a), trials (b, c)")
  ap.add_argument("--rollout_dtypes", default="float32,bfloat16",
                  help="(a) dtypes the float32 masters are published in")
  ap.add_argument("--skip_ray", action="store_true", help="(a) tensorstore only")
  ap.add_argument("--tmp_dir", default=None, help="(a) directory for the tensorstore store")
  ap.add_argument("--b_requests", type=int, default=32, help="(b) requests in the batch")
  ap.add_argument("--b_max_new", type=int, default=96, help="(b) tokens per response")
  ap.add_argument("--c_requests", type=int, default=64, help="(c) requests in the batch")
  ap.add_argument("--c_max_new", type=int, default=64, help="(c) tokens per response")
  args = ap.parse_args()
  path = os.path.join(RESULTS_DIR, "elastic.json")
  results = {}
  if os.path.exists(path):  # keep the other parts' latest results
    with open(path) as f:
      results = {k: v for k, v in json.load(f).items() if k in PARTS}
  for part in args.part or sorted(PARTS):
    results[part] = PARTS[part](args)
  write_json("elastic", results)


if __name__ == "__main__":
  main()

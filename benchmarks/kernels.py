"""Kernel benchmark on the local backend: naive reference vs fused / XLA path vs Pallas.

Run: `python -m benchmarks.kernels [--quick]`. Prints a table and writes
benchmarks/results/kernels.json. For every op and path it reports wall time (minimum over a few
runs after compilation) and the compiled program's temp memory from
`jax.jit(f).lower(...).compile().memory_analysis()` (temp_size_in_bytes: buffers beyond the
arguments and outputs). On CPU the Pallas kernels run in interpret mode: their values are checked
against the reference, but their time and memory are those of the interpreter, not of a GPU
kernel, and are reported as such (flag "interpret").
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys import kernels

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "kernels.json"


def measure(fn, args, runs: int) -> dict:
  """Compiles `fn`, then runs it `runs` times (min time). Returns stats and the output."""
  jitted = jax.jit(fn)
  t0 = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  times = []
  for _ in range(max(runs, 1)):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return dict(time_s=min(times), runs=len(times), compile_s=compile_s,
              temp_bytes=int(mem.temp_size_in_bytes),
              arg_bytes=int(mem.argument_size_in_bytes),
              out_bytes=int(mem.output_size_in_bytes)), out


def max_diff(a, b) -> float:
  """Max over output leaves of max|a - b| / max(1, max|b|) (absolute for O(1) values)."""
  diffs = []
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    diffs.append(float(np.max(np.abs(x - y))) / max(1.0, float(np.max(np.abs(y)))))
  return max(diffs)


def value_and_grad_sum(f, argnums):
  """value_and_grad of the sum of all outputs of f (so every output gets a cotangent)."""
  def loss(*a):
    return sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree.leaves(f(*a)))
  return jax.value_and_grad(loss, argnums=argnums)


def bench_logprobs(quick: bool, runs: int) -> list[dict]:
  tokens, d, vocab, chunk = (1024, 256, 8192, 1024) if quick else (8192, 1024, 32768, 1024)
  ks = jax.random.split(jax.random.key(0), 3)
  hidden = jax.random.normal(ks[0], (tokens, d), jnp.float32)
  unembed = jax.random.normal(ks[1], (d, vocab), jnp.float32) * d ** -0.5
  targets = jax.random.randint(ks[2], (tokens,), 0, vocab)
  shape = f"T={tokens} d={d} V={vocab} chunk={chunk} f32"
  naive = lambda h, w, y: kernels.logprobs_reference(h, w, y)
  fused = lambda h, w, y: kernels.fused_logprobs(h, w, y, chunk_size=chunk, impl="xla")
  rows = []
  for mode in ("fwd", "fwd+bwd"):
    wrap = (lambda f: f) if mode == "fwd" else (
        lambda f: lambda h, w, y: value_and_grad_sum(lambda h, w: f(h, w, y), (0, 1))(h, w))
    res_n, out_n = measure(wrap(naive), (hidden, unembed, targets), runs)
    rows.append(dict(op="fused_logprobs", mode=mode, path="naive (full logits)", shape=shape,
                     **res_n))
    res_f, out_f = measure(wrap(fused), (hidden, unembed, targets), runs)
    rows.append(dict(op="fused_logprobs", mode=mode, path="xla chunked", shape=shape, **res_f,
                     max_abs_diff=max_diff(out_f, out_n),
                     temp_ratio=res_n["temp_bytes"] / max(res_f["temp_bytes"], 1)))
    del out_n, out_f
  # Pallas on a small slice (on CPU: interpret mode, a correctness check only).
  sl = (hidden[:64], unembed[:256, :2048], targets[:64] % 2048)
  sl = (sl[0][:, :256],) + sl[1:]
  pallas = lambda h, w, y: value_and_grad_sum(
      lambda h, w: kernels.fused_logprobs(h, w, y, impl="pallas"), (0, 1))(h, w)
  ref = value_and_grad_sum(lambda h, w: naive(h, w, sl[2]), (0, 1))(*sl[:2])
  res_p, out_p = measure(pallas, sl, 1)
  rows.append(dict(op="fused_logprobs", mode="fwd+bwd", path=_pallas_label(),
                   shape="T=64 d=256 V=2048 f32", **res_p, max_abs_diff=max_diff(out_p, ref)))
  return rows


def _pallas_label() -> str:
  return "pallas (interpret)" if kernels.default_interpret() else "pallas"


def pallas_row(op, mode, f_pallas, f_ref, args, shape) -> dict:
  """Pallas vs reference on `args` (kept small on CPU, where the kernel is interpreted)."""
  res, out = measure(f_pallas, args, 1)
  return dict(op=op, mode=mode, path=_pallas_label(), shape=shape, **res,
              max_abs_diff=max_diff(out, jax.jit(f_ref)(*args)))


def _attention_inputs(key, b, s, hq, hkv, d):
  ks = jax.random.split(key, 3)
  q = jax.random.normal(ks[0], (b, s, hq, d), jnp.float32)
  k = jax.random.normal(ks[1], (b, s, hkv, d), jnp.float32)
  v = jax.random.normal(ks[2], (b, s, hkv, d), jnp.float32)
  seg = jnp.ones((b, s), jnp.int32).at[0, : s // 4].set(0)  # left padding in row 0
  return q, k, v, seg


def bench_flash_attention(quick: bool, runs: int) -> list[dict]:
  def vg(impl):
    return lambda q, k, v, seg: value_and_grad_sum(
        lambda q, k, v: kernels.flash_attention(q, k, v, segment_ids=seg, impl=impl),
        (0, 1, 2))(q, k, v)

  dims = (2, 256, 4, 2, 64) if quick else (2, 1024, 8, 2, 64)
  res, _ = measure(vg("xla"), _attention_inputs(jax.random.key(1), *dims), runs)
  rows = [dict(op="flash_attention", mode="fwd+bwd", path="xla (masked softmax)",
               shape="B=%d S=%d Hq=%d Hkv=%d D=%d f32" % dims, **res)]
  small = (1, 200, 4, 2, 64)
  rows.append(pallas_row("flash_attention", "fwd+bwd", vg("pallas"), vg("xla"),
                         _attention_inputs(jax.random.key(1), *small),
                         "B=%d S=%d Hq=%d Hkv=%d D=%d f32" % small))
  return rows


def _decode_inputs(key, b, length, hq, hkv, d):
  ks = jax.random.split(key, 3)
  q = jax.random.normal(ks[0], (b, hq, d), jnp.float32)
  kc = jax.random.normal(ks[1], (b, length, hkv, d), jnp.float32)
  vc = jax.random.normal(ks[2], (b, length, hkv, d), jnp.float32)
  lengths = jnp.linspace(length // 4, length, b).astype(jnp.int32)
  mask = (jnp.arange(length)[None] < lengths[:, None]) & (jnp.arange(length)[None] >= 3)
  return q, kc, vc, mask, lengths


def bench_decode_attention(quick: bool, runs: int) -> list[dict]:
  def f(impl):
    return lambda q, kc, vc, m, n: kernels.decode_attention(q, kc, vc, m, lengths=n, impl=impl)

  dims = (4, 512, 8, 2, 64) if quick else (8, 4096, 16, 4, 128)
  res, _ = measure(f("xla"), _decode_inputs(jax.random.key(2), *dims), runs)
  rows = [dict(op="decode_attention", mode="fwd", path="xla (masked softmax)",
               shape="B=%d L=%d Hq=%d Hkv=%d D=%d f32" % dims, **res)]
  small = (2, 1000, 8, 2, 64)
  rows.append(pallas_row("decode_attention", "fwd", f("pallas"), f("xla"),
                         _decode_inputs(jax.random.key(2), *small),
                         "B=%d L=%d Hq=%d Hkv=%d D=%d f32" % small))
  return rows


def _gmm_inputs(key, m, k, n, groups):
  ks = jax.random.split(key, 3)
  lhs = jax.random.normal(ks[0], (m, k), jnp.float32)
  rhs = jax.random.normal(ks[1], (groups, k, n), jnp.float32) * k ** -0.5
  sizes = jnp.floor(jax.random.dirichlet(ks[2], jnp.ones(groups)) * (m - 7)).astype(jnp.int32)
  return lhs, rhs, sizes


def _gmm_dense(lhs, rhs, sizes):
  """Naive: every row through every group's weights, then select its group (or zero)."""
  groups = rhs.shape[0]
  group_of_row = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(lhs.shape[0]), side="right")
  full = jnp.einsum("mk,gkn->gmn", lhs, rhs)
  picked = jnp.take_along_axis(full, jnp.minimum(group_of_row, groups - 1)[None, :, None],
                               axis=0)[0]
  return jnp.where((group_of_row < groups)[:, None], picked, 0.0)


def bench_grouped_matmul(quick: bool, runs: int) -> list[dict]:
  def vg(f):
    return lambda a, b, g: value_and_grad_sum(lambda a, b: f(a, b, g), (0, 1))(a, b)

  xla = lambda a, b, g: kernels.grouped_matmul(a, b, g, impl="xla")
  dims = (1024, 256, 512, 8) if quick else (4096, 1024, 2048, 8)
  args = _gmm_inputs(jax.random.key(3), *dims)
  shape = "m=%d k=%d n=%d G=%d f32" % dims
  res_n, out_n = measure(vg(_gmm_dense), args, runs)
  res_x, out_x = measure(vg(xla), args, runs)
  rows = [dict(op="grouped_matmul", mode="fwd+bwd", path="naive (dense all groups)",
               shape=shape, **res_n),
          dict(op="grouped_matmul", mode="fwd+bwd", path="xla ragged_dot", shape=shape, **res_x,
               max_abs_diff=max_diff(out_x, out_n),
               temp_ratio=res_n["temp_bytes"] / max(res_x["temp_bytes"], 1))]
  small = (500, 128, 256, 8)
  rows.append(pallas_row(
      "grouped_matmul", "fwd+bwd",
      vg(lambda a, b, g: kernels.grouped_matmul(a, b, g, impl="pallas")), vg(xla),
      _gmm_inputs(jax.random.key(3), *small), "m=%d k=%d n=%d G=%d f32" % small))
  return rows


def print_table(rows: list[dict]) -> None:
  header = (f"{'op':<17}{'mode':<9}{'path':<26}{'time ms':>10}{'temp MiB':>11}"
            f"{'naive/this':>11}{'max diff':>11}  shape")
  print(header)
  print("-" * len(header))
  for r in rows:
    ratio = f"{r['temp_ratio']:.1f}x" if "temp_ratio" in r else ""
    diff = f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else ""
    print(f"{r['op']:<17}{r['mode']:<9}{r['path']:<26}{r['time_s'] * 1e3:>10.1f}"
          f"{r['temp_bytes'] / 2**20:>11.1f}{ratio:>11}{diff:>11}  {r['shape']}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small shapes (seconds, not minutes)")
  parser.add_argument("--runs", type=int, default=2,
                      help="timed runs per measurement (the minimum is reported)")
  parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
  args = parser.parse_args()
  print(f"backend={jax.default_backend()} devices={jax.device_count()} jax={jax.__version__} "
        f"quick={args.quick}", flush=True)
  rows = []
  for bench in (bench_logprobs, bench_flash_attention, bench_decode_attention,
                bench_grouped_matmul):
    new_rows = bench(args.quick, args.runs)
    for r in new_rows:
      print(json.dumps(r), flush=True)
    rows += new_rows
  print_table(rows)
  if kernels.default_interpret():
    print("note: Pallas rows ran in interpret mode on CPU: values are checked, time/memory are "
          "the interpreter's and not meaningful.")
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps(dict(backend=jax.default_backend(), jax=jax.__version__,
                                      quick=args.quick, rows=rows), indent=2))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

"""GPU performance at real model sizes (issue 27): one table, one JSON.

    python -m benchmarks.gpu                 # on a GPU: the issue's shapes (minutes)
    python -m benchmarks.gpu --only kernels  # one section: kernels | decode | train | features
    python -m benchmarks.gpu --quick         # tiny shapes, seconds on CPU (in the test suite)
    python -m benchmarks.gpu --only decode --profile /tmp/trace   # + per-op time of decode
    python -m benchmarks.gpu --only tune     # sweep token_chunk, backward_vocab_chunk,
                                             # tile_rows, Pallas gmm tiles

Two models built from configs with random bf16 weights (no download): a Qwen2.5-0.5B shape
(hidden 896, 24 layers, 14/2 heads, mlp 4864, vocab 151936, tied) and a Qwen3-MoE shape (hidden
1024, 12 layers, 16/4 heads, 64 experts top-8 of width 384, vocab 151936). Measured:

- kernels: fused log-probs (T=8192, d=896, V=151936), flash attention (B8 S2048 Hq14 Hkv2 D64,
  causal), grouped matmul (m=262144, d=1024, f=384, E=64): every implementation of
  `jaxrl_sys.backend.KERNELS` beside the naive reference (full logits / XLA masked attention /
  equal-group einsum), forward and forward+backward ms, TFLOP/s, compiled temp memory; the
  `impl="auto"` choice is marked, so the table shows whether auto is the fastest path;
- decode (`benchmarks.gpu_decode`): `models.generate` (256 new tokens) at batch 64 and 256 on
  the 0.5B shape: tok/s, ms per step, the HBM floor (weights + the average KV cache read once
  per step at the device's bandwidth) as a fraction of the measured step, and what the compiled
  step loop runs per step (`benchmarks.hlo_stats`: kernels, copies and their bytes); on a GPU
  also the same program compiled with XLA options that may remove the per-step copies;
- train: one GRPO train step (fwd+bwd+AdamW) on both models, run as the CLI runs it
  (`benchmarks.gpu_train`): 8 x 8 x (32+256) as one program, and the issue's 32 x 8 x (32+256)
  in micro-batches of the CLI's default m_b groups, gradients accumulated before one update;
  MFU over the whole batch from `train.metrics_log.train_flops_per_token` over the bf16 peak;
- features (`benchmarks.gpu_features`): the engine's decode with unmerged LoRA adapters vs the
  plain model at the first decode shape (tok/s, HBM roofline fraction); the Qwen3-MoE shape's
  decode step with route capture on vs off (`routing_replay.decode_overhead`); the agentic
  benchmark's 64 episodes on the 0.5B shape's layers, async driver vs turn barrier at tool
  latency 0 and heavy-tailed (episodes/s, accelerator idle fraction, overlap bound);
- memory: compiled temp bytes (`memory_analysis()`) per row and the allocator's peak
  (`memory_stats()["peak_bytes_in_use"]`, GPU only) after each section;
- `--profile DIR`: a `jax.profiler` trace of the first decode batch and of the one-program train
  step, summed per op (`benchmarks.gpu_profile`): ms and kernel count per decode step / train
  step, and over all ops the kernels per step and the share of time in copies.

Writes benchmarks/results/gpu.json (gpu_quick.json with --quick) with the device name.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import time
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu_decode import decode_section
from benchmarks.gpu_features import features_section
from benchmarks.gpu_train import train_section
from benchmarks.common import print_table, write_json
from jaxrl_sys import backend, kernels
from jaxrl_sys.models.config import ModelConfig, MoEConfig
from jaxrl_sys.train.loop import metrics_log
from jaxrl_sys.train.recipe.run_config import RunConfig

MiB = 2 ** 20
# The command line's default m_b (`--micro_batch_groups`): the train row's micro-batch size.
CLI_MICRO_BATCH_GROUPS = RunConfig().loop.micro_batch_groups
# HBM bandwidth (bytes/s) by substring of the device kind (lower case); None: unknown.
HBM_BYTES_PER_S = (("h200", 4.8e12), ("h100 pcie", 2.0e12), ("h100", 3.35e12),
                   ("a100-sxm4-80gb", 2.04e12), ("a100", 1.56e12), ("l4", 0.3e12))


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Every shape the benchmark uses (the issue's, or tiny ones for --quick)."""
  dense: ModelConfig
  moe: ModelConfig
  logprobs: tuple[int, int, int]                 # T, d, V
  attention: tuple[int, int, int, int, int]      # B, S, Hq, Hkv, D
  gmm: tuple[int, int, int, int]                 # m, d, f, E
  decode_batches: tuple[int, ...]
  prompt_len: int
  new_tokens: int
  train_single: tuple[int, int, int, int]        # one program: prompts, group, prompt, response
  train: tuple[int, int, int, int]               # the CLI's micro-batches: the same fields
  micro_groups: int                              # m_b, groups per micro-batch of `train`
  repeats: int
  quick: bool = False


def sizes(quick: bool) -> Sizes:
  bf16 = dict(param_dtype="bfloat16", compute_dtype="bfloat16")
  if quick:
    dense = ModelConfig(vocab_size=512, hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                        head_dim=16, intermediate_size=128, max_seq_len=128, tie_embeddings=True,
                        attention_bias=True)
    moe = ModelConfig(vocab_size=512, hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                      head_dim=16, intermediate_size=128, max_seq_len=128, qk_norm=True,
                      moe=MoEConfig(num_experts=8, num_experts_per_tok=2,
                                    expert_intermediate_size=32))
    return Sizes(dense, moe, (256, 64, 512), (2, 64, 4, 2, 16), (512, 64, 32, 8), (4,), 8, 8,
                 (2, 2, 8, 8), (2, 2, 8, 8), 1, 1, quick=True)
  dense = ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                      num_kv_heads=2, head_dim=64, intermediate_size=4864, max_seq_len=4096,
                      tie_embeddings=True, attention_bias=True, **bf16)
  moe = ModelConfig(vocab_size=151936, hidden_size=1024, num_layers=12, num_heads=16,
                    num_kv_heads=4, head_dim=64, intermediate_size=3072, max_seq_len=4096,
                    qk_norm=True, architecture="Qwen3MoeForCausalLM",
                    moe=MoEConfig(num_experts=64, num_experts_per_tok=8,
                                  expert_intermediate_size=384), **bf16)
  return Sizes(dense, moe, (8192, 896, 151936), (8, 2048, 14, 2, 64), (262144, 1024, 384, 64),
               (64, 256), 32, 256, (8, 8, 32, 256), (32, 8, 32, 256), CLI_MICRO_BATCH_GROUPS, 10)


def device_info() -> dict:
  dev = jax.devices()[0]
  kind = f"{dev.device_kind} {dev.platform}".lower()
  bw = next((b for name, b in HBM_BYTES_PER_S if name in kind), None)
  return {"device": dev.device_kind, "platform": backend.platform(), "count": jax.device_count(),
          "peak_flops": metrics_log.peak_flops(dev), "hbm_bytes_per_s": bw,
          "auto": backend.describe(), "jax": jax.__version__}


def device_slug(kind: str) -> str:
  """A file-name form of a device kind: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
  words = re.sub(r"[^a-z0-9]+", " ", kind.lower()).split()
  return "-".join(w for w in words if w != "nvidia") or "device"


def allocator_peak_mib() -> float | None:
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / MiB


def measure(fn, *args, repeats: int) -> tuple[float, float]:
  """(median ms of `repeats` warm calls, compiled temp MiB) of `jax.jit(fn)(*args)`."""
  compiled = jax.jit(fn).lower(*args).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes / MiB
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times)) * 1e3, temp


def _fwd_bwd(f):
  """Gradient of a scalar of all of `f`'s outputs w.r.t. its first two (float) arguments."""
  def loss(*a):
    return sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree.leaves(f(*a)))
  return jax.grad(loss, (0, 1))


def _kernel_rows(kernel: str, shape: str, variants: dict, args, flops: float, naive: str,
                 auto: str, s: Sizes, fwd_bwd: dict | None = None) -> list[dict]:
  rows = []
  for impl, f in variants.items():
    row = {"section": "kernel", "name": kernel, "shape": shape, "impl": impl}
    try:
      if not s.quick:   # --quick: fwd+bwd only (half the compilations; same code)
        row["fwd_ms"], row["fwd_temp_mib"] = measure(f, *args, repeats=s.repeats)
      g = (fwd_bwd or {}).get(impl, _fwd_bwd(f))
      row["fwdbwd_ms"], row["fwdbwd_temp_mib"] = measure(g, *args, repeats=s.repeats)
      row["fwdbwd_tflops"] = 3 * flops / row["fwdbwd_ms"] / 1e9
    except Exception as e:  # pylint: disable=broad-except  # a failing path is a result too
      row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    row["auto"] = "<- auto" if impl == auto else ""
    rows.append(row)
  base = next((r for r in rows if r["impl"] == naive and "fwdbwd_ms" in r), None)
  timed = [r for r in rows if "fwdbwd_ms" in r]
  fastest = min(timed, key=lambda r: r["fwdbwd_ms"])["impl"] if timed else None
  for r in rows:
    if base and "fwdbwd_ms" in r:
      r["vs_naive"] = base["fwdbwd_ms"] / r["fwdbwd_ms"]
      r["mem_vs_naive"] = r["fwdbwd_temp_mib"] / max(base["fwdbwd_temp_mib"], 1e-9)
    r["fastest"] = fastest
  return rows


def _pallas_ok(with_pallas: bool) -> bool:
  return with_pallas or backend.platform() == "gpu"


# The token path's backward over vocabulary chunks (`fused_logprobs(backward_vocab_chunk=)`): at
# T=8192 a chunk's `[T, c]` float32 logits are 256 MiB, as the forward's auto token chunk. The
# token-chunk backward reads and writes its `[d, V]` float32 d_unembed accumulator once per token
# chunk (2 x 544 MiB x 32 chunks at the shape, ~10 ms of HBM traffic on an H100); this
# one computes each column once and accumulates only d_hidden `[T, d]`.
VOCAB_BWD_CHUNK = 8192


def kernel_section(s: Sizes, with_pallas: bool) -> Iterator[dict]:
  key = jax.random.PRNGKey(0)
  # Fused log-probs.
  t, d, v = s.logprobs
  h = jax.random.normal(key, (t, d), jnp.bfloat16)
  w = (jax.random.normal(key, (d, v), jnp.float32) * 0.02).astype(jnp.bfloat16)
  y = jax.random.randint(key, (t,), 0, v)
  impls = [i for i in backend.KERNELS["fused_logprobs"] if i != "pallas" or _pallas_ok(with_pallas)]
  variants = {"naive": lambda h, w, y: kernels.logprobs_reference(h, w, y)}
  variants |= {i: functools.partial(kernels.fused_logprobs, impl=i) for i in impls}
  if "xla_tokens" in impls:   # a candidate: token-chunk forward, vocabulary-chunk backward
    variants[f"xla_tokens vocab-bwd {VOCAB_BWD_CHUNK}"] = functools.partial(
        kernels.fused_logprobs, impl="xla_tokens", backward_vocab_chunk=VOCAB_BWD_CHUNK)
  yield from _kernel_rows("fused_logprobs", f"T{t} d{d} V{v} bf16", variants, (h, w, y),
                          2 * t * d * v, "naive", backend.kernel_impl("fused_logprobs"), s)
  # Flash attention (causal, no padding).
  b, sq, hq, hkv, dh = s.attention
  q = jax.random.normal(key, (b, sq, hq, dh), jnp.bfloat16)
  k = jax.random.normal(jax.random.fold_in(key, 1), (b, sq, hkv, dh), jnp.bfloat16)
  vv = jax.random.normal(jax.random.fold_in(key, 2), (b, sq, hkv, dh), jnp.bfloat16)
  impls = [i for i in backend.KERNELS["flash_attention"]
           if i != "pallas" or _pallas_ok(with_pallas)]
  variants = {i: functools.partial(kernels.flash_attention, impl=i) for i in impls}
  grads = {i: jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v).astype(jnp.float32)), (0, 1, 2))
           for i, f in variants.items()}
  auto = backend.kernel_impl("flash_attention", dtype=q.dtype, head_dim=dh)
  yield from _kernel_rows("flash_attention", f"B{b} S{sq} Hq{hq} Hkv{hkv} D{dh} bf16 causal",
                          variants, (q, k, vv), 2 * 2 * b * hq * sq * sq * dh / 2, "xla", auto,
                          s, fwd_bwd=grads)
  if not s.quick:   # the train batches' layout: right-padded rows (3/4 of the rows shorter)
    seg = (jnp.arange(sq)[None, :] < jnp.array([sq, sq * 3 // 4, sq // 2, sq // 4] * (b // 4)
                                               + [sq] * (b % 4))[:, None]).astype(jnp.int32)
    variants = {i: functools.partial(kernels.flash_attention, impl=i, segment_ids=seg)
                for i in impls}
    grads = {i: jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v).astype(jnp.float32)),
                         (0, 1, 2)) for i, f in variants.items()}
    yield from _kernel_rows(
        "flash_attention", f"B{b} S{sq} Hq{hq} Hkv{hkv} D{dh} bf16 right-padded", variants,
        (q, k, vv), 2 * 2 * b * hq * sq * sq * dh / 2, "xla", auto, s, fwd_bwd=grads)
  # Grouped matmul (equal groups, so the einsum reference does the same work).
  m, dm, f, e = s.gmm
  x = jax.random.normal(key, (m, dm), jnp.bfloat16)
  wt = (jax.random.normal(key, (e, dm, f), jnp.float32) * 0.02).astype(jnp.bfloat16)
  sizes_ = jnp.full((e,), m // e, jnp.int32)
  impls = [i for i in backend.KERNELS["grouped_matmul"] if i != "pallas" or _pallas_ok(with_pallas)]
  variants = {"einsum_equal_groups":
              lambda x, w: jnp.einsum("etd,edf->etf", x.reshape(e, m // e, dm), w)}
  variants |= {i: (lambda x, w, i=i: kernels.grouped_matmul(x, w, sizes_, impl=i)) for i in impls}
  yield from _kernel_rows("grouped_matmul", f"m{m} d{dm} f{f} E{e} bf16", variants, (x, wt),
                          2 * m * dm * f, "einsum_equal_groups",
                          backend.kernel_impl("grouped_matmul"), s)


# --tune: the knobs of the GPU paths, swept at the kernel shapes (fwd+bwd time and temp memory).
GMM_TILINGS = ((64, 64, 64), (128, 64, 64), (128, 64, 128), (128, 128, 128), (64, 128, 128),
               (256, 64, 128))
TOKEN_CHUNKS = (128, 256, 512, 1024, 2048)
VOCAB_BWD_CHUNKS = (2048, 4096, 8192, 16384)
TILE_ROWS = (128, 256, 512, 1024)


def tune_section(s: Sizes) -> Iterator[dict]:
  key = jax.random.PRNGKey(0)
  t, d, v = s.logprobs
  h = jax.random.normal(key, (t, d), jnp.bfloat16)
  w = (jax.random.normal(key, (d, v), jnp.float32) * 0.02).astype(jnp.bfloat16)
  y = jax.random.randint(key, (t,), 0, v)
  m, dm, f, e = s.gmm
  x = jax.random.normal(key, (m, dm), jnp.bfloat16)
  wt = (jax.random.normal(key, (e, dm, f), jnp.float32) * 0.02).astype(jnp.bfloat16)
  sizes_ = jnp.full((e,), m // e, jnp.int32)
  cases = [("fused_logprobs", f"token_chunk={c}", (h, w, y),
            functools.partial(kernels.fused_logprobs, impl="xla_tokens", token_chunk=c))
           for c in TOKEN_CHUNKS if c <= t]
  cases += [("fused_logprobs", f"backward_vocab_chunk={c}", (h, w, y),
             functools.partial(kernels.fused_logprobs, impl="xla_tokens", backward_vocab_chunk=c))
            for c in VOCAB_BWD_CHUNKS if c <= v]
  cases += [("grouped_matmul", f"xla_tiled tile_rows={r}", (x, wt),
             lambda x, w, r=r: kernels.grouped_matmul(x, w, sizes_, impl="xla_tiled", tile_rows=r))
            for r in TILE_ROWS if r <= m]
  if backend.platform() == "gpu":   # Pallas tiles (interpret mode elsewhere says nothing)
    cases += [("grouped_matmul", f"pallas tiling={tl}", (x, wt),
               lambda x, w, tl=tl: kernels.grouped_matmul(x, w, sizes_, impl="pallas", tiling=tl))
              for tl in GMM_TILINGS]
  for kernel, knob, args, fn in cases:
    row = {"section": "tune", "name": kernel, "impl": knob}
    try:
      row["fwdbwd_ms"], row["fwdbwd_temp_mib"] = measure(_fwd_bwd(fn), *args, repeats=s.repeats)
    except Exception as e:  # pylint: disable=broad-except
      row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    yield row


COLUMNS = ("section", "name", "impl", "auto", "shape", "fwd_ms", "fwdbwd_ms", "fwdbwd_tflops",
           "vs_naive", "fwd_temp_mib", "fwdbwd_temp_mib", "mem_vs_naive", "tok_per_s", "step_ms",
           "hbm_floor_ms", "roofline_frac", "kernels_per_step", "copy_mib_per_step",
           "write_mib_per_step", "micro_batches", "mfu", "vs_base", "capture_overhead_pct",
           "async_ep_per_s", "barrier_ep_per_s", "speedup", "async_idle", "barrier_idle",
           "of_bound", "same_tokens", "error")


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="tiny shapes: seconds on CPU")
  ap.add_argument("--only", choices=("kernels", "decode", "train", "features", "tune"),
                  action="append",
                  help="run only these sections (repeatable); default all")
  ap.add_argument("--pallas", action="store_true",
                  help="also time the Pallas kernels off GPU (interpret mode: slow)")
  ap.add_argument("--out", default=None,
                  help="results name (default gpu / gpu_quick); {device}, {jax} and {date} "
                       "are filled in, e.g. gpu_{device}_jax{jax}_{date}")
  ap.add_argument("--profile", default=None, metavar="DIR",
                  help="trace the first decode batch and the train step into DIR; per-op table")
  args = ap.parse_args(argv)
  s = sizes(args.quick)
  info = device_info()
  print(f"device {info['device']} ({info['platform']}), auto: {info['auto']}", flush=True)
  sections = args.only or ["kernels", "decode", "train", "features"]
  rows, peaks = [], {}
  profile = None if args.profile is None else {"dir": args.profile}
  interrupted = None
  for sec in sections:
    t0, c0 = time.perf_counter(), time.process_time()
    run = {"kernels": lambda: kernel_section(s, args.pallas),
           "decode": lambda: decode_section(s, info, profile),
           "tune": lambda: tune_section(s),
           "train": lambda: train_section(s, info, profile),
           "features": lambda: features_section(s, info)}[sec]
    try:
      for row in run():   # rows as they are measured: an interrupt keeps those so far
        rows.append(row)
    except KeyboardInterrupt:   # a time limit (SIGINT): write what was measured
      interrupted = sec
      print(f"{sec}: interrupted; writing the rows measured so far", flush=True)
    peaks[sec] = allocator_peak_mib()
    print(f"{sec}: {time.perf_counter() - t0:.1f}s wall, {time.process_time() - c0:.1f}s cpu, "
          f"allocator peak {peaks[sec]} MiB", flush=True)
    if interrupted:
      break
  used = [c for c in COLUMNS if any(r.get(c) not in (None, "") for r in rows)]
  if rows:
    print_table(rows, used)
  name = (args.out or ("gpu_quick" if args.quick else "gpu")).format(
      device=device_slug(info["device"]), jax=jax.__version__,
      date=time.strftime("%Y%m%d_%H%M", time.gmtime()))
  payload = {"device": info, "quick": args.quick, "rows": rows, "allocator_peak_mib": peaks,
             "interrupted": interrupted}
  for what, ops in (profile or {}).items():
    if what not in ("dir", "totals"):
      print(f"profile: {what} (top ops)")
      print_table(ops[:15])
      payload.setdefault("profile", {})[what] = ops
  if (profile or {}).get("totals"):
    payload["profile_totals"] = profile["totals"]
    print("profile totals (all ops): " + "; ".join(
        f"{what}: " + ", ".join(f"{k} {v:.4g}" for k, v in tot.items())
        for what, tot in profile["totals"].items()))
  write_json(name, payload)
  return payload


if __name__ == "__main__":
  main()

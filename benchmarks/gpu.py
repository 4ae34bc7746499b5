"""GPU performance at real model sizes (issue 27): one table, one JSON.

    python -m benchmarks.gpu                 # on a GPU: the issue's shapes (minutes)
    python -m benchmarks.gpu --only kernels  # one section: kernels | decode | train
    python -m benchmarks.gpu --quick         # tiny shapes, seconds on CPU (in the test suite)
    python -m benchmarks.gpu --only decode --profile /tmp/trace   # + per-op time of decode
    python -m benchmarks.gpu --only tune     # sweep token_chunk, tile_rows, Pallas gmm tiles

Two models built from configs with random bf16 weights (no download): a Qwen2.5-0.5B shape
(hidden 896, 24 layers, 14/2 heads, mlp 4864, vocab 151936, tied) and a Qwen3-MoE shape (hidden
1024, 12 layers, 16/4 heads, 64 experts top-8 of width 384, vocab 151936). Measured:

- kernels: fused log-probs (T=8192, d=896, V=151936), flash attention (B8 S2048 Hq14 Hkv2 D64,
  causal), grouped matmul (m=262144, d=1024, f=384, E=64): every implementation of
  `jaxrl_sys.backend.KERNELS` beside the naive reference (full logits / XLA masked attention /
  equal-group einsum), forward and forward+backward ms, TFLOP/s, compiled temp memory; the
  `impl="auto"` choice is marked, so the table shows whether auto is the fastest path;
- decode: `models.generate` (256 new tokens) at batch 64 and 256 on the 0.5B shape: tok/s, ms per
  step, and the HBM floor (weights + the average KV cache read once per step at the device's
  bandwidth) as a fraction of the measured step;
- train: one GRPO train step (`train.step.train_step`, fwd+bwd+AdamW) on both models: MFU from
  `train.metrics_log.train_flops_per_token` over the device's bf16 peak;
- memory: compiled temp bytes (`memory_analysis()`) per row and the allocator's peak
  (`memory_stats()["peak_bytes_in_use"]`, GPU only) after each section;
- `--profile DIR`: a `jax.profiler` trace of the first decode batch and of the dense train step,
  summed per op (`benchmarks.gpu_profile`): ms and kernel count per decode step / train step.

Writes benchmarks/results/gpu.json (gpu_quick.json with --quick) with the device name.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import gpu_profile
from benchmarks.common import print_table, write_json
from jaxrl_sys import backend, kernels, models
from jaxrl_sys.models.config import ModelConfig, MoEConfig
from jaxrl_sys.train.loop import metrics_log

MiB = 2 ** 20
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
  train: tuple[int, int, int, int]               # prompts, group, prompt len, response len
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
                 (2, 2, 8, 8), 1, quick=True)
  dense = ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                      num_kv_heads=2, head_dim=64, intermediate_size=4864, max_seq_len=4096,
                      tie_embeddings=True, attention_bias=True, **bf16)
  moe = ModelConfig(vocab_size=151936, hidden_size=1024, num_layers=12, num_heads=16,
                    num_kv_heads=4, head_dim=64, intermediate_size=3072, max_seq_len=4096,
                    qk_norm=True, architecture="Qwen3MoeForCausalLM",
                    moe=MoEConfig(num_experts=64, num_experts_per_tok=8,
                                  expert_intermediate_size=384), **bf16)
  return Sizes(dense, moe, (8192, 896, 151936), (8, 2048, 14, 2, 64), (262144, 1024, 384, 64),
               (64, 256), 32, 256, (32, 8, 32, 256), 10)


def device_info() -> dict:
  dev = jax.devices()[0]
  kind = f"{dev.device_kind} {dev.platform}".lower()
  bw = next((b for name, b in HBM_BYTES_PER_S if name in kind), None)
  return {"device": dev.device_kind, "platform": backend.platform(), "count": jax.device_count(),
          "peak_flops": metrics_log.peak_flops(dev), "hbm_bytes_per_s": bw,
          "auto": backend.describe(), "jax": jax.__version__}


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


def kernel_section(s: Sizes, with_pallas: bool) -> list[dict]:
  key = jax.random.PRNGKey(0)
  rows = []
  # Fused log-probs.
  t, d, v = s.logprobs
  h = jax.random.normal(key, (t, d), jnp.bfloat16)
  w = (jax.random.normal(key, (d, v), jnp.float32) * 0.02).astype(jnp.bfloat16)
  y = jax.random.randint(key, (t,), 0, v)
  impls = [i for i in backend.KERNELS["fused_logprobs"] if i != "pallas" or _pallas_ok(with_pallas)]
  variants = {"naive": lambda h, w, y: kernels.logprobs_reference(h, w, y)}
  variants |= {i: functools.partial(kernels.fused_logprobs, impl=i) for i in impls}
  rows += _kernel_rows("fused_logprobs", f"T{t} d{d} V{v} bf16", variants, (h, w, y),
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
  rows += _kernel_rows("flash_attention", f"B{b} S{sq} Hq{hq} Hkv{hkv} D{dh} bf16 causal",
                       variants, (q, k, vv), 2 * 2 * b * hq * sq * sq * dh / 2, "xla", auto, s,
                       fwd_bwd=grads)
  if not s.quick:   # the train batches' layout: right-padded rows (3/4 of the rows shorter)
    seg = (jnp.arange(sq)[None, :] < jnp.array([sq, sq * 3 // 4, sq // 2, sq // 4] * (b // 4)
                                               + [sq] * (b % 4))[:, None]).astype(jnp.int32)
    variants = {i: functools.partial(kernels.flash_attention, impl=i, segment_ids=seg)
                for i in impls}
    grads = {i: jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v).astype(jnp.float32)),
                         (0, 1, 2)) for i, f in variants.items()}
    rows += _kernel_rows("flash_attention", f"B{b} S{sq} Hq{hq} Hkv{hkv} D{dh} bf16 right-padded",
                         variants, (q, k, vv), 2 * 2 * b * hq * sq * sq * dh / 2, "xla", auto, s,
                         fwd_bwd=grads)
  # Grouped matmul (equal groups, so the einsum reference does the same work).
  m, dm, f, e = s.gmm
  x = jax.random.normal(key, (m, dm), jnp.bfloat16)
  wt = (jax.random.normal(key, (e, dm, f), jnp.float32) * 0.02).astype(jnp.bfloat16)
  sizes_ = jnp.full((e,), m // e, jnp.int32)
  impls = [i for i in backend.KERNELS["grouped_matmul"] if i != "pallas" or _pallas_ok(with_pallas)]
  variants = {"einsum_equal_groups":
              lambda x, w: jnp.einsum("etd,edf->etf", x.reshape(e, m // e, dm), w)}
  variants |= {i: (lambda x, w, i=i: kernels.grouped_matmul(x, w, sizes_, impl=i)) for i in impls}
  rows += _kernel_rows("grouped_matmul", f"m{m} d{dm} f{f} E{e} bf16", variants, (x, wt),
                       2 * m * dm * f, "einsum_equal_groups",
                       backend.kernel_impl("grouped_matmul"), s)
  return rows


# --tune: the knobs of the GPU paths, swept at the kernel shapes (fwd+bwd time and temp memory).
GMM_TILINGS = ((64, 64, 64), (128, 64, 64), (128, 64, 128), (128, 128, 128), (64, 128, 128),
               (256, 64, 128))
TOKEN_CHUNKS = (128, 256, 512, 1024, 2048)
TILE_ROWS = (128, 256, 512, 1024)


def tune_section(s: Sizes) -> list[dict]:
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
  cases += [("grouped_matmul", f"xla_tiled tile_rows={r}", (x, wt),
             lambda x, w, r=r: kernels.grouped_matmul(x, w, sizes_, impl="xla_tiled", tile_rows=r))
            for r in TILE_ROWS if r <= m]
  if backend.platform() == "gpu":   # Pallas tiles (interpret mode elsewhere says nothing)
    cases += [("grouped_matmul", f"pallas tiling={tl}", (x, wt),
               lambda x, w, tl=tl: kernels.grouped_matmul(x, w, sizes_, impl="pallas", tiling=tl))
              for tl in GMM_TILINGS]
  rows = []
  for kernel, knob, args, fn in cases:
    row = {"section": "tune", "name": kernel, "impl": knob}
    try:
      row["fwdbwd_ms"], row["fwdbwd_temp_mib"] = measure(_fwd_bwd(fn), *args, repeats=s.repeats)
    except Exception as e:  # pylint: disable=broad-except
      row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    rows.append(row)
  return rows


def _param_bytes(params) -> int:
  return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(params))


def decode_section(s: Sizes, info: dict, profile: dict | None = None) -> list[dict]:
  c = s.dense
  params = models.init_params(c, jax.random.PRNGKey(0))
  sampling = models.SamplingConfig(temperature=1.0, max_new_tokens=s.new_tokens, stop_tokens=())
  kv_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * jnp.dtype(c.cdtype).itemsize
  rows = []
  for batch in s.decode_batches:
    prompts = jax.random.randint(jax.random.PRNGKey(batch), (batch, s.prompt_len), 3, c.vocab_size)
    run = lambda k: models.generate(params, c, prompts, key=k, sampling=sampling)  # noqa: E731
    t0 = time.perf_counter()
    jax.block_until_ready(run(jax.random.PRNGKey(0)).tokens)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = run(jax.random.PRNGKey(1))
    jax.block_until_ready(out.tokens)
    secs = time.perf_counter() - t0
    step_ms = secs / s.new_tokens * 1e3
    # One step reads every weight once and, per row, the KV cache at its average length.
    floor_bytes = _param_bytes(params) + batch * kv_per_token * (s.prompt_len + s.new_tokens / 2)
    bw = info["hbm_bytes_per_s"]
    floor_ms = floor_bytes / bw * 1e3 if bw else None
    rows.append({"section": "decode", "name": "generate", "impl": "auto",
                 "shape": f"0.5B b{batch} p{s.prompt_len} +{s.new_tokens}",
                 "tok_per_s": batch * s.new_tokens / secs, "step_ms": step_ms,
                 "hbm_floor_ms": floor_ms, "roofline_frac": floor_ms / step_ms if bw else None,
                 "compile_s": compile_s, "generated": int(out.lengths.sum())})
    if profile is not None and batch == s.decode_batches[0]:
      ops = gpu_profile.profile_ops(lambda: run(jax.random.PRNGKey(2)).tokens, calls=2,
                                    out_dir=profile["dir"] + f"/decode_b{batch}")
      for r in ops:   # per decode step (prefill included, spread over the steps)
        r["ms_per_step"], r["count_per_step"] = (r["ms_per_call"] / s.new_tokens,
                                                 r["count_per_call"] / s.new_tokens)
      profile[f"decode_b{batch}"] = ops
  return rows


def _train_batch(c: ModelConfig, shape, key):
  from jaxrl_sys.train.step.batch import TrainBatch  # pylint: disable=import-outside-toplevel
  prompts, group, lp, lr = shape
  rows, t = prompts * group, lp + lr
  tokens = jax.random.randint(key, (1, rows, t), 3, c.vocab_size)
  adv = jax.random.normal(key, (1, rows))
  return TrainBatch(tokens=tokens, targets=tokens[:, :, lp:], attention_mask=jnp.ones_like(tokens),
                    loss_mask=jnp.ones((1, rows, lr), jnp.float32),
                    behav_logprobs=jnp.full((1, rows, lr), -5.0, jnp.float32),
                    versions=jnp.zeros((1, rows, lr), jnp.int32), advantages=adv,
                    score_start=jnp.full((1, rows), lp - 1, jnp.int32))


def train_section(s: Sizes, info: dict, profile: dict | None = None) -> list[dict]:
  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.sharding import make_mesh
  from jaxrl_sys.train.step import update as step_lib
  from jaxrl_sys.train.step.config import TrainConfig
  from jaxrl_sys.train.step.optim import make_optimizer
  from jaxrl_sys.train.step.state import init_train_state
  rows = []
  models_ = (("dense 0.5B", s.dense), ("Qwen3-MoE", s.moe))
  # --quick: the MoE model only (the same code; the dense step is compiled by the train tests).
  for name, c in models_[1:] if s.quick else models_:
    tc = TrainConfig()
    opt = make_optimizer(tc.optim)
    mesh = make_mesh("1")
    batch = _train_batch(c, s.train, jax.random.PRNGKey(3))
    prompts, group, lp, lr = s.train
    row = {"section": "train", "name": f"grpo step {name}", "impl": "auto",
           "shape": f"{prompts}x{group}x({lp}+{lr})"}
    try:
      state = init_train_state(c, tc, opt, mesh=mesh)
      fn = functools.partial(step_lib.train_step, model_config=c, train_config=tc, optimizer=opt)
      # The whole output (new state and metrics): returning the loss alone lets XLA drop the
      # backward pass and the update, which measured the forward only (an "MFU" above 1).
      ms, temp = measure(fn, state, batch, repeats=s.repeats)
      flops = metrics_log.train_flops_per_token(c, lp + lr, reference=False, scored_len=lr)
      tokens = prompts * group * (lp + lr)
      row |= {"step_ms": ms, "fwdbwd_temp_mib": temp,
              "mfu": flops * tokens / (ms / 1e3) / info["peak_flops"]}
      if profile is not None and f"train {name}" not in profile:
        step = jax.jit(lambda st, b: fn(st, b)[1]["loss"])
        profile[f"train {name}"] = gpu_profile.profile_ops(
            lambda: step(state, batch), calls=2, out_dir=profile["dir"] + "/train")
    except Exception as e:  # pylint: disable=broad-except  # an OOM is the measurement
      row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    rows.append(row)
  return rows


COLUMNS = ("section", "name", "impl", "auto", "shape", "fwd_ms", "fwdbwd_ms", "fwdbwd_tflops",
           "vs_naive", "fwd_temp_mib", "fwdbwd_temp_mib", "mem_vs_naive", "tok_per_s", "step_ms",
           "hbm_floor_ms", "roofline_frac", "mfu", "error")


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="tiny shapes: seconds on CPU")
  ap.add_argument("--only", choices=("kernels", "decode", "train", "tune"), action="append",
                  help="run only these sections (repeatable); default all")
  ap.add_argument("--pallas", action="store_true",
                  help="also time the Pallas kernels off GPU (interpret mode: slow)")
  ap.add_argument("--out", default=None, help="results name (default gpu / gpu_quick)")
  ap.add_argument("--profile", default=None, metavar="DIR",
                  help="trace the first decode batch and the train step into DIR; per-op table")
  args = ap.parse_args(argv)
  s = sizes(args.quick)
  info = device_info()
  print(f"device {info['device']} ({info['platform']}), auto: {info['auto']}", flush=True)
  sections = args.only or ["kernels", "decode", "train"]
  rows, peaks = [], {}
  profile = None if args.profile is None else {"dir": args.profile}
  for sec in sections:
    t0, c0 = time.perf_counter(), time.process_time()
    if sec == "kernels":
      rows += kernel_section(s, args.pallas)
    elif sec == "decode":
      rows += decode_section(s, info, profile)
    elif sec == "tune":
      rows += tune_section(s)
    else:
      rows += train_section(s, info, profile)
    peaks[sec] = allocator_peak_mib()
    print(f"{sec}: {time.perf_counter() - t0:.1f}s wall, {time.process_time() - c0:.1f}s cpu, "
          f"allocator peak {peaks[sec]} MiB", flush=True)
  used = [c for c in COLUMNS if any(r.get(c) not in (None, "") for r in rows)]
  print_table(rows, used)
  name = args.out or ("gpu_quick" if args.quick else "gpu")
  payload = {"device": info, "quick": args.quick, "rows": rows, "allocator_peak_mib": peaks}
  for what, ops in (profile or {}).items():
    if what != "dir":
      print(f"profile: {what} (top ops)")
      print_table(ops[:15])
      payload.setdefault("profile", {})[what] = ops
  write_json(name, payload)
  return payload


if __name__ == "__main__":
  main()

"""The decode rows of `benchmarks.gpu`: `models.generate` against the HBM roofline.

Per batch: tok/s, ms per step, the HBM floor (every weight and the average KV cache read once
per step at the device's bandwidth) over the measured step, and what the compiled step loop
runs per step (`benchmarks.hlo_stats.per_step` of the very program `generate` runs: the
compile is shared): kernels, copies and the MiB they write, slice fusions, in-place updates.

On a GPU (not --quick), after every batch's row, the first batch is also compiled with each of
`XLA_VARIANTS` (XLA options that may remove the per-kernel launches of a step, one CUDA graph
per call, or the per-step copies of stacked weights / KV-cache slices the profile showed: 34% of
GPU time, 714 kernels per step on an H100) and timed the same way, beside the default program
timed again, so the rows compare within one process.
"""
from __future__ import annotations

import functools
import time
from typing import Iterator

import jax
import jax.numpy as jnp

from benchmarks import gpu_profile, hlo_stats
from jaxrl_sys import backend, models
from jaxrl_sys.models import sampling as sampling_lib

MiB = 2 ** 20
# (name, XLA compile options) tried on a GPU, most promising first (the stage's time limit may
# cut the last); an option this XLA does not know is a row error.
CUDA_GRAPHS = {  # the whole step loop (nested while loops included) recorded as one CUDA graph
    "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUDNN,CUSTOM_CALL,CONDITIONAL,WHILE",
    "xla_gpu_graph_min_graph_size": 1}
SLICE_FUSION = {"xla_gpu_enable_dynamic_slice_fusion": True}
XLA_VARIANTS = (
    # A decode step launches hundreds of small kernels (714 on an H100): launch overhead, not
    # HBM, bounds it; replaying one graph per call removes the per-kernel launches.
    ("CUDA graphs (while loops)", CUDA_GRAPHS),
    # cuBLAS reads a layer's weights / a cache slice in place instead of a copy per step.
    ("dynamic-slice fusion", SLICE_FUSION),
    ("CUDA graphs + dynamic-slice fusion", CUDA_GRAPHS | SLICE_FUSION),
    # The layer loop unrolled by two, so slices of the next layer overlap this one's work.
    ("while double-buffering", {"xla_gpu_enable_while_loop_double_buffering": True}),
)


def param_bytes(params) -> int:
  """Bytes of every array of a pytree."""
  return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(params))


def hbm_floor_ms(weight_bytes: int, c, batch: int, prompt_len: int, new_tokens: int,
                 bw: float | None) -> float | None:
  """One decode step's HBM floor in ms: `weight_bytes` and, per row, the KV cache of model `c`
  at its average length (prompt + half the new tokens) read once at `bw` bytes/s (None when
  the bandwidth is unknown)."""
  kv_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * jnp.dtype(c.cdtype).itemsize
  floor_bytes = weight_bytes + batch * kv_per_token * (prompt_len + new_tokens / 2)
  return floor_bytes / bw * 1e3 if bw else None


def _program(params, config, prompts, sampling):
  """(lowered program, its arguments): the jitted program `models.generate` runs for these
  prompts (the same function, arguments and static settings, so it compiles once)."""
  b, t = prompts.shape
  args = (params, prompts, jnp.ones((b, t), jnp.int32),
          sampling_lib.request_keys(jax.random.PRNGKey(0), b), None)
  lowered = sampling_lib._generate.lower(  # pylint: disable=protected-access
      *args, config=config, sampling=sampling, cache_len=t + sampling.max_new_tokens)
  return lowered, args


def hlo_columns(text: str) -> dict:
  """What a compiled decode program's step loop runs per step (`hlo_stats`), as row columns."""
  step = hlo_stats.per_step(text) or {}
  return {"kernels_per_step": step.get("kernels"), "copies_per_step": step.get("copies"),
          "copy_mib_per_step": (step["copy_bytes"] / MiB) if step else None,
          "write_mib_per_step": (step["write_bytes"] / MiB) if step else None,
          "slice_fusions_per_step": step.get("slice_fusions"),
          "update_slices_per_step": step.get("update_slices"),
          "largest_writes": hlo_stats.per_step_largest(text)}


def _row(impl: str, secs: float, *, shape: str, tokens: int, steps: int,
         floor_ms: float | None, **extra) -> dict:
  step_ms = secs / steps * 1e3
  return {"section": "decode", "name": "generate", "impl": impl, "shape": shape,
          "tok_per_s": tokens / secs, "step_ms": step_ms, "hbm_floor_ms": floor_ms,
          "roofline_frac": None if floor_ms is None else floor_ms / step_ms, **extra}


def _time_once(fn) -> float:
  jax.block_until_ready(fn())   # warm
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def decode_section(s, info: dict, profile: dict | None = None) -> Iterator[dict]:
  """The decode rows of `s` (a `benchmarks.gpu.Sizes`), as they are measured; see the module
  docstring."""
  c = s.dense
  params = models.init_params(c, jax.random.PRNGKey(0))
  sampling = models.SamplingConfig(temperature=1.0, max_new_tokens=s.new_tokens, stop_tokens=())
  bw = info["hbm_bytes_per_s"]
  variants = None
  for batch in s.decode_batches:
    prompts = jax.random.randint(jax.random.PRNGKey(batch), (batch, s.prompt_len), 3, c.vocab_size)
    run = lambda k: models.generate(params, c, prompts, key=k, sampling=sampling)  # noqa: E731
    shape = f"0.5B b{batch} p{s.prompt_len} +{s.new_tokens}"
    # One step reads every weight once and, per row, the KV cache at its average length.
    floor_ms = hbm_floor_ms(param_bytes(params), c, batch, s.prompt_len, s.new_tokens, bw)

    row = functools.partial(_row, shape=shape, tokens=batch * s.new_tokens,
                            steps=s.new_tokens, floor_ms=floor_ms)
    t0 = time.perf_counter()
    lowered, args = _program(params, c, prompts, sampling)
    compiled = lowered.compile()
    hlo = hlo_columns(compiled.as_text())
    jax.block_until_ready(run(jax.random.PRNGKey(0)).tokens)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = run(jax.random.PRNGKey(1))
    jax.block_until_ready(out.tokens)
    secs = time.perf_counter() - t0
    yield row("auto", secs, compile_s=compile_s, generated=int(out.lengths.sum()), **hlo)
    first = batch == s.decode_batches[0]
    if first and backend.platform() == "gpu" and not s.quick:
      variants = (row, shape, lowered, compiled, args, hlo)   # timed after every batch's row
    if profile is not None and first:
      ops, tot = gpu_profile.profile_summary(lambda: run(jax.random.PRNGKey(2)).tokens, calls=2,
                                             out_dir=profile["dir"] + f"/decode_b{batch}")
      for r in ops:   # per decode step (prefill included, spread over the steps)
        r["ms_per_step"], r["count_per_step"] = (r["ms_per_call"] / s.new_tokens,
                                                 r["count_per_call"] / s.new_tokens)
      profile[f"decode_b{batch}"] = ops
      profile.setdefault("totals", {})[f"decode_b{batch}"] = {
          "ms_per_step": tot["ms_per_call"] / s.new_tokens,
          "kernels_per_step": tot["count_per_call"] / s.new_tokens,
          "copy_share": tot["copy_share"], "update_slice_share": tot["update_slice_share"]}
  if variants is not None:
    yield from _variant_rows(*variants)


def _variant_rows(row, shape: str, lowered, compiled, args, hlo: dict) -> Iterator[dict]:
  """The first batch's program timed again (the A/B base) and compiled with each of
  `XLA_VARIANTS`, in one process."""
  yield row("auto (compiled, A/B base)", _time_once(lambda: compiled(*args).tokens), **hlo)
  for name, options in XLA_VARIANTS:
    try:
      variant = lowered.compile(compiler_options=options)
      secs = _time_once(lambda f=variant: f(*args).tokens)
      extra = hlo_columns(variant.as_text())
    except Exception as e:  # pylint: disable=broad-except  # an unknown option is a result
      yield {"section": "decode", "name": "generate", "impl": name, "shape": shape,
             "error": f"{type(e).__name__}: {str(e)[:160]}"}
      continue
    yield row(name, secs, **extra)

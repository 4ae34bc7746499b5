"""The feature rows of `benchmarks.gpu` (issue 45's last bullet): what unmerged LoRA adapters,
MoE route capture and the agentic episode driver cost or gain on the device.

- lora: the rollout engine's decode program (`rollout.engine.slots.decode`, the program that
  applies unmerged adapters `x @ A @ B` beside each frozen matmul) at the decode rows' first
  shape (the 0.5B shape, batch 64, a 32-token prompt's cache, 256 new tokens in one call), the
  plain model against adapters of rank `LORA_RANK` on attention + MLP: tok/s, ms per step, the
  HBM floor (`gpu_decode.hbm_floor_ms`: weights, the adapters too, and the average KV cache
  read once per step) over the step, the step time over the plain model's (`vs_base`), and what
  the compiled step runs per step. Best of `LORA_REPEATS` timed calls each, interleaved.
- routes: the Qwen3-MoE shape's one-token decode step with and without capturing its routes,
  as `benchmarks.routing_replay.decode_overhead` compares them (a jitted loop of
  `ROUTE_STEPS` forward steps, `forward(return_routes=...)`, the routes written to a
  `[rows, steps, layers, k]` buffer as the engine's decode does; no sampling; best of
  `ROUTE_REPEATS` interleaved) at the decode batch and cache width: ms per step, capture
  overhead in percent.
- agentic: `benchmarks.agentic`'s 64 episodes (4 turns of 16 tokens, 3 tool calls each) on a
  model with the 0.5B shape's layers and the char tokenizer's vocabulary, tool latency 0 and
  heavy-tailed, the asynchronous episode driver against the turn barrier on the same engine
  settings (`agentic.engine_config`, every program compiled first): episodes/s, accelerator
  idle fraction, speedup, fraction of the overlap bound (`agentic.episode_row`), and the share
  of episodes whose tokens are identical in both runs (1.0 on a CPU; a GPU's kernels may round
  differently at another batch size).

Each part runs on its own: one that fails becomes a row with the error and the next one runs.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import jax
import jax.numpy as jnp

from benchmarks import gpu_decode
from jaxrl_sys import models

LORA_RANK = 8
LORA_REPEATS = 2
ROUTE_STEPS = 32
ROUTE_REPEATS = 5
AGENTIC_LATENCIES = ("0", "heavy")


def _error(section: str, name: str, e: Exception) -> dict:
  return {"section": section, "name": name, "error": f"{type(e).__name__}: {str(e)[:160]}"}


def lora_rows(s, info: dict) -> Iterator[dict]:
  """Engine decode, the plain model against unmerged adapters (module docstring)."""
  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.models import kv_cache as kvc
  from jaxrl_sys.models import lora as lora_lib
  from jaxrl_sys.models.config import LoraConfig
  from jaxrl_sys.rollout.engine import slots
  c = s.dense
  mc = dataclasses.replace(c, lora=LoraConfig(rank=LORA_RANK))
  base = models.init_params(c, jax.random.PRNGKey(0))
  # B non-zero (a trained adapter's), cast to the base's dtype as a rollout engine holds it.
  ad = jax.tree_util.tree_map_with_path(
      lambda p, x: (1e-3 * jnp.ones_like(x) if p[-1].key == "b" else x).astype(c.param_dtype),
      lora_lib.init_lora(mc, jax.random.PRNGKey(1)))
  batch, t, n = s.decode_batches[0], s.prompt_len, s.new_tokens
  width = t + n
  sampling = models.SamplingConfig(temperature=1.0, stop_tokens=())
  args = (jnp.zeros((batch,), jnp.int32),
          jnp.arange(2 * batch, dtype=jnp.uint32).reshape(batch, 2),   # raw per-row keys
          jnp.zeros((batch,), jnp.int32), jnp.full((batch,), n, jnp.int32),
          jnp.ones((batch,), bool), None)

  def cache():   # a fresh cache each call (decode donates it): the prompt's t positions filled
    kv = kvc.init_cache(c, batch, width)
    return jax.block_until_ready(kv._replace(
        kv_valid=kv.kv_valid.at[:, :t].set(True), write_pos=jnp.full((batch,), t, jnp.int32),
        next_position=jnp.full((batch,), t, jnp.int32)))

  shape = f"0.5B b{batch} p{t} +{n}"
  variants, rows = {}, {}
  for impl, config, lora in (("plain", c, None), (f"unmerged rank {LORA_RANK}", mc, ad)):
    try:
      t0 = time.perf_counter()
      compiled = slots.decode.lower(base, cache(), *args, lora, config=config, sampling=sampling,
                                    num_steps=n, width=width).compile()
      out = compiled(base, cache(), *args, lora)   # warm
      generated = int(jax.block_until_ready(out[3]).sum())
      weights = gpu_decode.param_bytes(base) + (0 if lora is None else gpu_decode.param_bytes(lora))
      floor_ms = gpu_decode.hbm_floor_ms(weights, c, batch, t, n, info["hbm_bytes_per_s"])
      variants[impl] = (compiled, lora)
      cols = {k: v for k, v in gpu_decode.hlo_columns(compiled.as_text()).items()
              if k != "largest_writes"}
      rows[impl] = {"section": "lora", "name": "engine decode", "impl": impl, "shape": shape,
                    "hbm_floor_ms": floor_ms, "compile_s": time.perf_counter() - t0,
                    "generated": generated, "secs": float("inf"), **cols}
    except Exception as e:  # pylint: disable=broad-except  # a failing path is a result too
      rows[impl] = dict(_error("lora", "engine decode", e), impl=impl, shape=shape)
  for _ in range(LORA_REPEATS):   # interleaved, best of each: a busy host slows both alike
    for impl, (compiled, lora) in variants.items():
      kv = cache()
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(base, kv, *args, lora))
      rows[impl]["secs"] = min(rows[impl]["secs"], time.perf_counter() - t0)
  plain = rows["plain"]
  for r in rows.values():
    secs = r.pop("secs", None)
    if secs is not None:
      r["step_ms"], r["tok_per_s"] = secs / n * 1e3, batch * n / secs
      r["roofline_frac"] = (None if r["hbm_floor_ms"] is None
                            else r["hbm_floor_ms"] / r["step_ms"])
      if "step_ms" in plain:
        r["vs_base"] = r["step_ms"] / plain["step_ms"]
    yield r


def route_rows(s, info: dict) -> Iterator[dict]:
  """MoE decode steps with route capture off and on (module docstring)."""
  del info
  from benchmarks import routing_replay  # pylint: disable=import-outside-toplevel
  cfg = s.moe
  rows, width = s.decode_batches[0], s.prompt_len + s.new_tokens
  params, state = routing_replay.policy(cfg)
  res = routing_replay.decode_overhead(cfg, params, state, rows, ROUTE_STEPS, width,
                                       repeats=ROUTE_REPEATS)
  shape = f"Qwen3-MoE b{rows} ctx{width // 2} x{ROUTE_STEPS}"
  base = {"section": "routes", "name": "MoE decode forward", "shape": shape}
  off, on = res["decode_step_ms"], res["decode_step_capture_ms"]
  yield dict(base, impl="capture off", step_ms=off, tok_per_s=rows / off * 1e3)
  yield dict(base, impl="capture on", step_ms=on, tok_per_s=rows / on * 1e3, vs_base=on / off,
             capture_overhead_pct=res["capture_overhead_pct"])


def agentic_model(s) -> models.ModelConfig:
  """The 0.5B shape's layers (bf16 on a GPU) with `benchmarks.agentic`'s vocabulary and
  context."""
  from benchmarks import agentic  # pylint: disable=import-outside-toplevel
  return dataclasses.replace(s.dense, vocab_size=agentic.CFG.vocab_size,
                             max_seq_len=agentic.CFG.max_seq_len)


def agentic_rows(s, info: dict) -> Iterator[dict]:
  """Async episodes against the turn barrier (module docstring)."""
  del info
  # pylint: disable=import-outside-toplevel
  from benchmarks import agentic
  from jaxrl_sys.rollout import Engine
  cfg = agentic_model(s)
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  Engine(cfg, params, agentic.engine_config()).warmup()   # compiles every program first
  agentic.run_episodes(params, "0", False, cfg)           # and a warm pass, as agentic.main
  gen = None
  layers = f"{cfg.num_layers}x{cfg.hidden_size}"
  for kind in AGENTIC_LATENCIES:
    a, b = (agentic.run_episodes(params, kind, barrier, cfg) for barrier in (False, True))
    if gen is None:   # latency 0 first: pure generation, the faster of the two
      gen = min(a["wall"], b["wall"])
    same = sum(bool((x.tokens.shape == b["out"][e].tokens.shape)
                    and (x.tokens == b["out"][e].tokens).all()) for e, x in a["out"].items())
    yield {"section": "agentic", "name": "episodes async vs barrier",
           "impl": f"tool latency {kind}", "shape": f"64 ep x {agentic.TURNS} turns, {layers}",
           "same_tokens": same / len(a["out"]), **agentic.episode_row(kind, a, b, gen)}


def features_section(s, info: dict) -> Iterator[dict]:
  """The rows of every part, as they are measured; a part that fails is an error row."""
  for section, name, part in (("lora", "engine decode", lora_rows),
                              ("routes", "MoE decode forward", route_rows),
                              ("agentic", "episodes async vs barrier", agentic_rows)):
    try:
      yield from part(s, info)
    except Exception as e:  # pylint: disable=broad-except  # the next part still runs
      yield _error(section, name, e)

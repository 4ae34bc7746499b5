"""MoE routing replay (R3): rollout-train mismatch with and without replay, the decode cost of
capturing routes, and route bytes per token.

Usage: python -m benchmarks.routing_replay [--quick] [--requests 32] [--new_tokens 24]

For each config (the tests' tiny MoE and a larger one, both BIP-balanced with a capacity limit,
the balancing that makes a batch's routing depend on its batch-mates), the rollout engine
generates `--requests` responses (8 prompts x 4 samples; per-token routing, routes recorded);
the trainer's forward then scores them as a training batch with routing replay R3 (the
recorded routes forced) and off (BIP and capacity over the training batch). Mismatch against
the engine's log-probs of the sampled tokens, d = logp_train - logp_rollout: max |d| and
KL(rollout || train) estimated on the samples (k3: E[exp(d) - 1 - d]); plus the fraction of
(token, layer) routes the training batch routes differently (`moe/replay_agreement`).

Decode overhead: a jitted loop of `--decode_steps` one-token decode steps over a full slot batch,
with and without returning the routes (`forward(return_routes=...)`), best of 9 interleaved.
Writes benchmarks/results/routing_replay.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import print_table, timeit, write_json
from jaxrl_sys import models
from jaxrl_sys.losses.mismatch import mismatch_stats
from jaxrl_sys.models import kv_cache as kvc
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.rollout import Engine, EngineConfig, Request, request_key
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.step.update import batch_routes, token_logprobs

_MOE = dict(balancing="bip", bip_iterations=4, capacity_factor=1.0)
CONFIGS = {
    "tiny": models.ModelConfig(
        vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        intermediate_size=64, max_seq_len=64,
        moe=models.MoEConfig(num_experts=4, num_experts_per_tok=2, expert_intermediate_size=16,
                             **_MOE)),
    "larger": models.ModelConfig(
        vocab_size=512, hidden_size=256, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=32,
        intermediate_size=512, max_seq_len=128,
        moe=models.MoEConfig(num_experts=32, num_experts_per_tok=4, expert_intermediate_size=128,
                             **_MOE)),
}


def policy(cfg: models.ModelConfig, logit_std: float = 3.0, seed: int = 0):
  """Random weights with a decisive router (scaled so the router logits of a normed hidden
  state have standard deviation `logit_std`, as a trained router's are spread), and BIP duals
  as a trainer's earlier steps leave them (positive, spread)."""
  params = models.init_params(cfg, jax.random.PRNGKey(seed))
  scale = logit_std / (0.02 * cfg.hidden_size ** 0.5)
  params["layers"]["moe"]["router"] = params["layers"]["moe"]["router"] * scale
  q = jnp.abs(jax.random.normal(jax.random.PRNGKey(seed + 1),
                                (cfg.num_layers, cfg.moe.num_experts))) * 0.02
  return params, moe.init_moe_state(cfg)._replace(q=q)


def rollout(cfg, params, state, n: int, new_tokens: int, prompt_len: int = 16):
  rng = np.random.default_rng(0)
  reqs = []
  for i in range(n):
    if i % 4 == 0:
      prompt = rng.integers(1, cfg.vocab_size, size=int(rng.integers(prompt_len // 2,
                                                                     prompt_len + 1)))
    reqs.append(Request(i, prompt, new_tokens, request_key(0, i), group_id=i // 4))
  ec = EngineConfig(num_slots=n, max_len=prompt_len + new_tokens,
                    prefill_batch_buckets=(n,), decode_row_buckets=(n,),
                    decode_len_buckets=(prompt_len + new_tokens,), stream_every=8,
                    sampling=models.SamplingConfig(temperature=1.0))
  engine = Engine(cfg, params, ec, moe_state=state)
  engine.submit(reqs)
  out = {c.request_id: c.request for c in engine.run()}
  return [out[i] for i in range(n)]


def mismatch(cfg, params, state, reqs, mode: str, row_len: int, window: int) -> dict:
  samples = [batch_lib.Sample(r.prompt, r.tokens, r.logprobs, r.versions, 0.0, 1.0, r.routes)
             for r in reqs]
  m = cfg.moe
  b = batch_lib.pack(samples, len(samples), row_len, window=window,
                     route_shape=(cfg.num_layers, m.num_experts_per_tok, np.uint8))
  tc = TrainConfig(routing_replay=mode)

  @jax.jit
  def run(p, b):
    lp, _, aux = token_logprobs(p, cfg, tc, b, state, routes=batch_routes(cfg, tc, b))
    return lp, aux

  lp, aux = run(params, b)
  d = (np.asarray(lp, np.float64) - b.behav_logprobs)[b.loss_mask > 0]
  stats = mismatch_stats(lp, b.behav_logprobs, b.loss_mask)
  # Which routes the training batch would choose: agreement of live and recorded routes.
  live = jax.jit(lambda p, b: models.forward(p, cfg, b.tokens, attention_mask=b.attention_mask,
                                              moe_state=state, return_routes=True).routes)(
                                                  params, b)
  rec, mask = b.routes, b.route_mask
  hit = np.any(np.asarray(live.experts)[..., :, None] == rec[..., None, :], -1)   # [r, T, L, k]
  del aux
  return {"max_abs_logp_diff": float(np.abs(d).max()),
          "kl_k3": float(np.mean(np.expm1(d) - d)),
          "mismatch_out_frac": float(stats["mismatch_out_frac"]),
          # the training metric moe/replay_agreement: recorded assignments the batch's live
          # routing also chose; and (token, layer) pairs whose whole expert set is the same
          "assignment_agreement": float(hit[mask].mean()),
          "set_agreement": float(np.all(hit, -1)[mask].mean())}


def decode_overhead(cfg, params, state, rows: int, steps: int, width: int,
                    repeats: int = 9) -> dict:
  cache = kvc.init_cache(cfg, rows, width)
  cache = cache._replace(kv_valid=cache.kv_valid.at[:, :width // 2].set(True),
                         write_pos=jnp.full((rows,), width // 2, jnp.int32),
                         next_position=jnp.full((rows,), width // 2, jnp.int32))
  tok = jnp.ones((rows, 1), jnp.int32)

  @functools.partial(jax.jit, static_argnames=("capture",))
  def loop(params, cache, capture: bool):
    m = cfg.moe
    buf = jnp.zeros((rows, steps, cfg.num_layers, m.num_experts_per_tok), jnp.uint8)

    def body(i, c):
      cache, buf, acc = c
      out = models.forward(params, cfg, tok, cache=cache, moe_state=state, kv_window=width,
                           return_routes=capture)
      if capture:
        buf = buf.at[:, i].set(out.routes.experts[:, 0])
      return out.cache._replace(write_pos=cache.write_pos), buf, acc + out.hidden[:, 0, 0]

    _, buf, acc = jax.lax.fori_loop(0, steps, body, (cache, buf, jnp.zeros((rows,))))
    return buf, acc

  out = {False: float("inf"), True: float("inf")}
  for capture in out:
    jax.block_until_ready(loop(params, cache, capture))
  for _ in range(repeats):   # interleaved, best of each: a busy host slows both alike
    for capture in out:
      t = timeit(lambda c=capture: jax.block_until_ready(loop(params, cache, c)), repeats=1,
                 warmup=0) / steps
      out[capture] = min(out[capture], t)
  return {"decode_step_ms": out[False] * 1e3, "decode_step_capture_ms": out[True] * 1e3,
          "capture_overhead_pct": 100.0 * (out[True] / out[False] - 1.0)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--requests", type=int, default=32)
  ap.add_argument("--new_tokens", type=int, default=24)
  ap.add_argument("--decode_steps", type=int, default=32)
  ap.add_argument("--router_logit_std", type=float, default=3.0)
  ap.add_argument("--quick", action="store_true", help="tiny config only, fewer tokens")
  args = ap.parse_args()
  names = ["tiny"] if args.quick else list(CONFIGS)
  new_tokens = 8 if args.quick else args.new_tokens
  rows = []
  for name in names:
    cfg = CONFIGS[name]
    params, state = policy(cfg, args.router_logit_std)
    t0 = time.perf_counter()
    reqs = rollout(cfg, params, state, args.requests, new_tokens)
    t_roll = time.perf_counter() - t0
    m = cfg.moe
    per_tok = cfg.num_layers * m.num_experts_per_tok * np.dtype(np.uint8).itemsize
    positions = sum(r.num_routed for r in reqs)
    row_len = 16 + new_tokens
    base = {"config": name, "layers": cfg.num_layers, "experts": m.num_experts,
            "k": m.num_experts_per_tok, "route_bytes_per_token": per_tok,
            "route_bytes_total": int(sum(r.routes.nbytes for r in reqs)),
            "routed_positions": int(positions), "rollout_s": t_roll}
    for mode in ("off", "R3"):
      rows.append(dict(base, mode=mode, **mismatch(cfg, params, state, reqs, mode, row_len,
                                                   new_tokens)))
    rows[-1].update(decode_overhead(cfg, params, state, args.requests, args.decode_steps,
                                    row_len))
  cols = ["config", "mode", "max_abs_logp_diff", "kl_k3", "mismatch_out_frac",
          "assignment_agreement", "set_agreement", "route_bytes_per_token", "decode_step_ms",
          "decode_step_capture_ms", "capture_overhead_pct"]
  print_table(rows, cols)
  write_json("routing_replay", {"rows": rows, "args": vars(args),
                                "configs": {n: dataclasses.asdict(CONFIGS[n]) for n in names}})


if __name__ == "__main__":
  main()

"""Loss + gradient time and compiled memory of every policy-loss mode.

Usage: python -m benchmarks.losses [--batch 64] [--seq 1024] [--repeats 5]
Each mode is `jax.jit(jax.value_and_grad(loss))` with respect to the per-token log-probs (and the
entropy where the mode uses it), on random `[batch, seq]` float32 inputs with ~75% valid tokens
(the MC-GRPO row also computes median advantages over groups of 8 binary rewards).
Memory comes from `jit(f).lower(...).compile().memory_analysis()`. Writes
benchmarks/results/losses.json.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import print_table, timeit, write_json
from jaxrl_sys import losses as L

MODES = {
    "grpo (k3 KL, seq-mean-token-mean)": dict(config=L.preset("grpo")[1], ref=True),
    "dapo (clip-higher, token-mean)": dict(config=L.preset("dapo")[1]),
    "drgrpo (constant normaliser)": dict(
        config=L.PolicyLossConfig(aggregation="seq_mean_token_sum_norm",
                                  drgrpo_constant_length=1024)),
    "dual clip + entropy bonus": dict(
        config=L.PolicyLossConfig(dual_clip_c=3.0, entropy_coef=0.01), entropy=True),
    "decoupled PPO (AReaL, cap 5 mask)": dict(
        config=L.PolicyLossConfig(decoupled=True, aggregation="token_mean", behav_weight_cap=5.0,
                                  behav_weight_cap_mode="mask"), behav=True),
    "mc_grpo (median advantages + loss)": dict(config=L.preset("mc_grpo")[1], ref=True,
                                               median=True),
    "vcpo (loss + ESS scale)": dict(config=L.preset("vcpo")[1], ess=True),
}


def make_fn(config, *, ref=False, behav=False, entropy=False, median=False, ess=False):
  """Returns f(inputs) -> (loss, grads) for one mode."""
  def f(x):
    adv = x["adv"]
    mask = x["mask"]
    if median:
      out = L.mc_grpo_advantages(x["rewards"], group_size=8)  # B must split into groups
      adv, mask = out.advantages, mask * out.mask[:, None]

    def loss_fn(lp, ent):
      out = L.policy_loss(lp, x["old"], adv, mask, config=config,
                          ref_logprobs=x["ref"] if ref else None,
                          behav_logprobs=x["behav"] if behav else None,
                          entropy=ent if entropy else None)
      return out.loss, out.aux

    (loss, aux), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
        x["lp"], x["ent"])
    if ess:
      log_w = L.sequence_log_weights(x["lp"], x["behav"], mask)
      aux = dict(aux, lr_scale=L.ess_lr_scale(L.effective_sample_size(log_w), log_w.shape[0]))
    return loss, grads, aux
  return f


def inputs(batch, seq, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(seq // 2, seq + 1, batch)
  lp = rng.normal(-1.5, 0.5, (batch, seq))
  x = dict(lp=lp, old=lp + rng.normal(0, 0.1, lp.shape), ref=lp + rng.normal(0, 0.1, lp.shape),
           behav=lp + rng.normal(0, 0.1, lp.shape), ent=rng.uniform(0, 2, lp.shape),
           adv=rng.normal(size=batch),
           rewards=rng.integers(0, 2, batch).astype(np.float64))
  x = {k: jnp.asarray(v, jnp.float32) for k, v in x.items()}
  x["mask"] = jnp.asarray(np.arange(seq)[None] < lengths[:, None])
  return x


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--seq", type=int, default=1024)
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  x = inputs(args.batch, args.seq)
  mib = 1 / 2**20
  rows = []
  for name, spec in MODES.items():
    spec = dict(spec)
    fn = jax.jit(make_fn(spec.pop("config"), **spec))
    t0 = time.perf_counter()
    compiled = fn.lower(x).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    seconds = timeit(lambda: jax.block_until_ready(compiled(x)), repeats=args.repeats)
    rows.append({
        "mode": name, "loss+grad ms": seconds * 1e3, "compile s": compile_s,
        "temp MiB": mem.temp_size_in_bytes * mib,
        "args MiB": mem.argument_size_in_bytes * mib,
        "out MiB": mem.output_size_in_bytes * mib,
        "Mtok/s": args.batch * args.seq / seconds / 1e6,
    })
  print(f"B={args.batch} T={args.seq} float32, backend={jax.default_backend()}, "
        f"best of {args.repeats}")
  print_table(rows)
  write_json("losses", {"batch": args.batch, "seq": args.seq, "repeats": args.repeats,
                        "rows": rows})


if __name__ == "__main__":
  main()

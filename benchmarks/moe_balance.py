"""Pre-train a tiny MoE LM with each balancing method; AvgMaxVio per step and final loss.

Usage: python -m benchmarks.moe_balance [--steps 200] [--quick]
Corpus: a synthetic first-order Markov chain over the vocabulary with Zipf-distributed
transitions (skewed token statistics push the router towards a few experts). Also times the
expert-parallel MoE layer against the dense-einsum MoE on 8 fake CPU devices.
"""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks.common import RESULTS_DIR, print_table, timeit, write_json  # noqa: E402
from jaxrl_sys import models, sharding  # noqa: E402
from jaxrl_sys.models.moe import block as moe  # noqa: E402

METHODS = ("none", "aux_loss", "aux_free", "bip")


def corpus(vocab: int, batch: int, seq: int, steps: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  ranks = np.arange(1, vocab + 1, dtype=np.float64) ** -1.2
  trans = np.stack([rng.permutation(ranks) for _ in range(vocab)])
  trans /= trans.sum(1, keepdims=True)
  cum = trans.cumsum(1)
  out = np.zeros((steps, batch, seq), np.int32)
  state = rng.integers(0, vocab, (steps, batch))
  u = rng.random((steps, batch, seq))
  for t in range(seq):
    out[:, :, t] = state
    state = np.minimum((cum[state] < u[:, :, t, None]).sum(-1), vocab - 1)
  return out


def config_for(method: str, experts: int = 16) -> models.ModelConfig:
  return models.ModelConfig(
      vocab_size=128, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
      intermediate_size=128, max_seq_len=64,
      moe=models.MoEConfig(num_experts=experts, num_experts_per_tok=2, expert_intermediate_size=32,
                           balancing=method, aux_loss_coef=1e-2, bias_update_rate=1e-3,
                           bip_iterations=4))


def pretrain_step(cfg: models.ModelConfig, lr: float):
  """(jitted language-model pre-training step, its AdamW) of the MoE `cfg`: next-token
  cross-entropy plus the balancing method's auxiliary loss; the step returns (params, opt
  state, MoE state, cross-entropy, per-layer expert load)."""
  tx = optax.adamw(lr)

  def loss_fn(p, st, toks):
    out = models.forward(p, cfg, toks[:, :-1], moe_state=st)
    logits = models.logits_from_hidden(p, cfg, out.hidden)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, toks[:, 1:]).mean()
    return ce + moe.moe_aux_loss(out.aux), (ce, out.aux)

  @jax.jit
  def step(p, o, st, toks):
    (_, (ce, aux)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, st, toks)
    upd, o = tx.update(g, o, p)
    return optax.apply_updates(p, upd), o, moe.update_moe_state(st, aux, cfg), ce, aux["load"]

  return step, tx


def train(method: str, data: np.ndarray, lr: float = 3e-3):
  cfg = config_for(method)
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  state = moe.init_moe_state(cfg)
  step, tx = pretrain_step(cfg, lr)
  opt = tx.init(params)

  vio, losses = [], []
  t0 = time.perf_counter()
  for toks in data:
    params, opt, state, ce, load = step(params, opt, state, jnp.asarray(toks))
    per_layer = np.asarray(load).max(-1) / np.asarray(load).mean(-1) - 1.0
    vio.append(float(per_layer.mean()))
    losses.append(float(ce))
  return {"method": method, "avg_maxvio_step1": vio[0], "avg_maxvio_mean": float(np.mean(vio)),
          "avg_maxvio_last": vio[-1], "final_loss": float(np.mean(losses[-10:])),
          "train_s": time.perf_counter() - t0}, vio, losses


def ep_throughput(tokens: int = 2048):
  rows = []
  mesh = sharding.make_mesh("1x8")
  for impl in ("dense", "ragged", "expert_parallel"):
    cfg = config_for("none")
    cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, implementation=impl))
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (tokens // 64, 64), 0, cfg.vocab_size)
    f = jax.jit(lambda p, t, cfg=cfg: models.forward(p, cfg, t).hidden)
    with jax.set_mesh(mesh):
      s = timeit(lambda: jax.block_until_ready(f(params, toks)), repeats=3)
    rows.append({"moe_impl": impl, "tokens": tokens, "tokens_per_s": tokens / s})
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=200)
  ap.add_argument("--quick", action="store_true")
  args = ap.parse_args()
  steps = 30 if args.quick else args.steps
  data = corpus(128, 16, 65, steps)
  rows, curves = [], {}
  for m in METHODS:
    row, vio, losses = train(m, data)
    rows.append(row)
    curves[m] = {"avg_maxvio": vio, "loss": losses}
    print(row, flush=True)
  print_table(rows)
  ep = ep_throughput()
  print_table(ep)
  write_json("moe_balance", {"steps": steps, "rows": rows, "curves": curves, "ep": ep})
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(1, 2, figsize=(10, 4))
  for m in METHODS:
    ax[0].plot(curves[m]["avg_maxvio"], label=m)
    ax[1].plot(curves[m]["loss"], label=m)
  ax[0].set_title("AvgMaxVio per step")
  ax[0].set_yscale("log")
  ax[1].set_title("LM loss")
  ax[0].legend()
  fig.tight_layout()
  fig.savefig(os.path.join(RESULTS_DIR, "moe_balance.png"))


if __name__ == "__main__":
  main()

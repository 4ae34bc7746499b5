"""The MoE regime of `benchmarks.algorithms`: the tiny MoE preset pre-trained as a language
model with each balancing method (none, aux-loss, aux-free, BIP); AvgMaxVio and LM loss per step.

The corpus is a first-order Markov chain with Zipf(1.2) transitions over the preset's
vocabulary (skewed token statistics push a router towards a few experts); the seed sets the
initial weights and the corpus.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np


def markov_corpus(vocab: int, batch: int, seq: int, steps: int, seed: int) -> np.ndarray:
  """`[steps, batch, seq]` tokens of a first-order Markov chain with Zipf(1.2) transitions
  (skewed token statistics push a router towards a few experts)."""
  from benchmarks.moe_balance import corpus  # pylint: disable=import-outside-toplevel
  return corpus(vocab, batch, seq, steps, seed)


def run_moe(balancing: str, seed: int, steps: int, batch: tuple = (16, 65),
            lr: float = 3e-3) -> dict:
  """Pre-trains the tiny MoE preset with `balancing`; AvgMaxVio and LM loss per step."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp

  from jaxrl_sys import models
  from jaxrl_sys.models.moe import block as moe
  from jaxrl_sys.train.recipe.presets import MATH_CHARS, tiny_config
  from jaxrl_sys.tasks import CharTokenizer
  vocab = CharTokenizer(MATH_CHARS).vocab_size
  cfg = tiny_config(vocab, max_seq_len=64, moe=True)
  cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, balancing=balancing))
  data = markov_corpus(vocab, *batch, steps, seed)
  step, tx = _moe_step(cfg, lr)
  params = models.init_params(cfg, jax.random.PRNGKey(seed))
  opt, state = tx.init(params), moe.init_moe_state(cfg)
  vio, loss = [], []
  t0 = time.perf_counter()
  for toks in data:
    params, opt, state, ce, load = step(params, opt, state, jnp.asarray(toks))
    load = np.asarray(load, np.float64)
    vio.append(float((load.max(-1) / load.mean(-1) - 1.0).mean()))
    loss.append(float(ce))
  tail = max(steps // 5, 1)
  return {"seed": seed, "seconds": time.perf_counter() - t0, "maxvio_mean": float(np.mean(vio)),
          "maxvio_last": float(np.mean(vio[-tail:])), "lm_loss_last": float(np.mean(loss[-tail:])),
          "maxvio": vio, "lm_loss": loss}


_MOE_STEPS: dict = {}


def _moe_step(cfg, lr: float):
  """(jitted pre-training step, its AdamW) of `cfg` (one per method, reused across seeds)."""
  from benchmarks.moe_balance import pretrain_step  # pylint: disable=import-outside-toplevel
  if (cfg, lr) in _MOE_STEPS:
    return _MOE_STEPS[cfg, lr]
  step, tx = pretrain_step(cfg, lr)
  _MOE_STEPS[cfg, lr] = step, tx
  return step, tx



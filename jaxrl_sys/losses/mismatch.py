"""Rollout-train mismatch: how far the engine's log-probs are from the trainer's.

With a bfloat16 rollout and float32 training (or any two numerics: another attention kernel,
another reduction order) the behaviour log-probs the engine reports differ from what the
trainer computes for the same tokens under the same weights; in the asynchronous modes the
difference also holds the staleness of the weights that sampled them. Per token, with
d = logp_train - logp_rollout:

    mismatch_mean       mean |d| over response tokens
    mismatch_max        max |d|
    mismatch_out_frac   fraction of tokens whose ratio exp(d) leaves [0.5, 2] (|d| > ln 2)

A large mismatch biases the on-policy gradient. The remedy is the truncated importance weight
min(pi_train / pi_rollout, C) per token (`PolicyLossConfig.behav_weight_cap`,
`experiments.grpo --behav_weight_cap=C`).
"""
from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.losses import checks

# A token's ratio pi_train / pi_rollout outside [1 / RATIO_BAND, RATIO_BAND] counts as far off.
RATIO_BAND = 2.0


def mismatch_stats(train_logprobs: jax.Array, rollout_logprobs: jax.Array,
                   mask: jax.Array) -> dict[str, jax.Array]:
  """Mismatch statistics of one batch.

  Args:
    train_logprobs: `[rows, T]` float, the trainer's log-probs of the sampled tokens.
    rollout_logprobs: `[rows, T]` float, the engine's (behaviour) log-probs of the same tokens.
    mask: `[rows, T]` response-token mask (bool or {0, 1}).

  Returns:
    float32 `[]` entries `mismatch_mean`, `mismatch_max`, `mismatch_out_frac` (0 when the mask
    is empty).
  """
  chex.assert_rank([train_logprobs, rollout_logprobs, mask], 2)
  chex.assert_equal_shape([train_logprobs, rollout_logprobs, mask])
  for name, x in (("train_logprobs", train_logprobs), ("rollout_logprobs", rollout_logprobs)):
    checks.check_dtype(x, f"mismatch_stats: {name}", allow_bool=False)
  valid = mask != 0
  d = jnp.abs(train_logprobs.astype(jnp.float32) - rollout_logprobs.astype(jnp.float32))
  d = jnp.where(valid, d, 0.0)
  n = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
  out = jnp.sum(valid & (d > math.log(RATIO_BAND)))
  return {"mismatch_mean": jnp.sum(d) / n, "mismatch_max": jnp.max(d, initial=0.0),
          "mismatch_out_frac": out.astype(jnp.float32) / n}

"""Aggregation of a per-token loss `[batch, seq]` into a scalar, as numerator / denominator.

Modes (m = mask, L_i = sum_t m_{i,t}, R = number of non-empty rows, i.e. L_i > 0):

    seq_mean_token_mean      numerator = sum_i (sum_t m l) / max(L_i, 1)    denominator = R
    token_mean  (DAPO)       numerator = sum_{i,t} m l                      denominator = sum m
    seq_mean_token_sum_norm  numerator = sum_{i,t} m l                      denominator = R * C
    seq_mean_token_sum       numerator = sum_{i,t} m l                      denominator = R

C is `constant_length` (Dr. GRPO's constant, e.g. the max completion length) or the padded
length T. Each numerator is a sum of per-row terms, so for a batch split into micro-batches

    full-batch loss = sum(numerators) / sum(denominators),

and passing the full batch's denominator (`loss_denominator` of the whole batch) as
`denominator=` makes the micro-batch losses (and their gradients) sum to the full-batch ones.
Empty rows (all tokens masked, e.g. excluded MC-GRPO pivots) are not counted in R.
"""
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.losses import checks
from jaxrl_sys.losses.config import AGGREGATIONS, PolicyLossConfig


class LossOutput(NamedTuple):
  """A loss ready for global normalisation across gradient-accumulation micro-batches.

  Attributes:
    loss: float scalar, `numerator / denominator` (0 when the denominator is 0).
    numerator: float scalar, the unreduced (differentiable) sum.
    denominator: float scalar, constant with respect to the inputs (no gradient).
    aux: dict of float/int scalar metrics, all detached.
  """
  loss: jax.Array
  numerator: jax.Array
  denominator: jax.Array
  aux: dict


def _check_mode(mode: str) -> None:
  if mode not in AGGREGATIONS:
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")


def safe_divide(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
  """numerator / denominator, 0 where the denominator is 0 (NaN-free value and gradient)."""
  ok = denominator > 0
  return jnp.where(ok, numerator / jnp.where(ok, denominator, 1), 0)


def loss_denominator(
    mask: jax.Array,
    mode: str | PolicyLossConfig,
    *,
    constant_length: int | None = None,
    dtype=jnp.float32,
) -> jax.Array:
  """Denominator of an aggregation mode for this mask (see module docstring).

  Use it on the whole batch's mask to get the `denominator=` for every micro-batch.

  Args:
    mask: `[batch, seq]` bool or {0, 1}.
    mode: aggregation mode, or a `PolicyLossConfig` (its aggregation and
      `drgrpo_constant_length` are used).
    constant_length: C of "seq_mean_token_sum_norm" (default: seq).
    dtype: float dtype of the result.

  Returns:
    float scalar.
  """
  if isinstance(mode, PolicyLossConfig):
    mode, constant_length = mode.aggregation, mode.drgrpo_constant_length
  _check_mode(mode)
  chex.assert_rank(mask, 2)
  checks.check_dtype(mask, "loss_denominator: mask")
  checks.check_mask(mask, "loss_denominator: mask")
  valid = mask != 0
  if mode == "token_mean":
    return jnp.sum(valid).astype(dtype)
  rows = jnp.sum(jnp.any(valid, axis=-1)).astype(dtype)
  if mode == "seq_mean_token_sum_norm":
    return rows * (mask.shape[1] if constant_length is None else constant_length)
  return rows


def loss_numerator(per_token: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
  """Unreduced numerator of an aggregation mode (see module docstring).

  Args:
    per_token: float `[batch, seq]`; masked positions may hold anything, even NaN.
    mask: `[batch, seq]` bool or {0, 1}.
    mode: aggregation mode.

  Returns:
    float scalar of per_token's dtype.
  """
  _check_mode(mode)
  chex.assert_rank([per_token, mask], 2)
  chex.assert_equal_shape([per_token, mask])
  valid = mask != 0
  masked = jnp.where(valid, per_token, 0)
  if mode == "seq_mean_token_mean":
    lengths = jnp.maximum(jnp.sum(valid, axis=-1), 1).astype(per_token.dtype)
    return jnp.sum(jnp.sum(masked, axis=-1) / lengths)
  return jnp.sum(masked)


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    mode: str,
    *,
    constant_length: int | None = None,
    denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Aggregates a per-token loss.

  Args:
    per_token: float `[batch, seq]`.
    mask: `[batch, seq]` bool or {0, 1}.
    mode: aggregation mode.
    constant_length: C of "seq_mean_token_sum_norm".
    denominator: optional externally given denominator (e.g. of the whole batch across
      micro-batches); it replaces the local one and is treated as a constant. It must be finite
      and > 0 while `mask` has a valid token (`checks.check_denominator`).

  Returns:
    (loss, numerator, denominator), float scalars.
  """
  numerator = loss_numerator(per_token, mask, mode)
  if denominator is None:
    denominator = loss_denominator(mask, mode, constant_length=constant_length,
                                   dtype=per_token.dtype)
  else:
    chex.assert_rank(denominator, 0)
    checks.check_denominator(denominator, mask != 0)
    denominator = jax.lax.stop_gradient(jnp.asarray(denominator, per_token.dtype))
  return safe_divide(numerator, denominator), numerator, denominator


def masked_mean(x: jax.Array, valid: jax.Array) -> jax.Array:
  """Mean of `x` over `valid` positions (0 if none); NaN-safe at invalid positions."""
  count = jnp.sum(valid)
  return safe_divide(jnp.sum(jnp.where(valid, x, 0)), count.astype(x.dtype))

"""Group-relative advantages from outcome rewards: GRPO (mean/std), Dr. GRPO, MC-GRPO (median).

One prompt has a group of G completions with scalar rewards r_1..r_G (spec section 1.1, 2):

    GRPO:     A_i = (r_i - mean) / (std + eps)            std with `ddof` (default 1)
    Dr. GRPO: A_i =  r_i - mean
    MC-GRPO:  A_i = (r_i - med) / (MAD + eps)             med = lower median of the G+1 rewards,
                                                          MAD = lower median of |r_j - med|

For the median baseline exactly one member per group, the pivot (the lowest index whose reward
equals the median), gets advantage 0 and mask 0: multiply the response mask by the returned
`mask` (`response_mask * out.mask[:, None]`) so that only G completions carry gradient and the
pivot's tokens leave every denominator.

Zero-variance groups (all rewards equal) get an advantage of exactly 0 and are counted in
`aux["zero_variance_groups"]`; `aux["zero_variance"]` flags them per group, so a DAPO-style
dynamic sampler can drop them.
"""
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.losses import checks
from jaxrl_sys.losses.config import AdvantageConfig, preset


class AdvantageOutput(NamedTuple):
  """Advantages and the per-sample gradient mask.

  Attributes:
    advantages: float array, same shape as the rewards (`[N]` or `[P, G]`).
    mask: float {0, 1} array, same shape; 0 marks MC-GRPO pivots (excluded from the gradient).
    aux: dict of metrics: `zero_variance_groups` (int32 count), `zero_variance_frac`,
      `zero_variance` (bool `[P]`), `reward_mean`, `reward_std` (over the batch), and for the
      median baseline `pivot_index` (int32 `[P]`, index inside each group).
  """
  advantages: jax.Array
  mask: jax.Array
  aux: dict


def as_groups(x: jax.Array, group_size: int | None) -> jax.Array:
  """Reshapes `[P * G]` (with `group_size=G`) or `[P, G]` to `[P, G]`."""
  chex.assert_rank(x, {1, 2})
  if x.ndim == 2:
    if group_size is not None and group_size != x.shape[1]:
      raise ValueError(f"group_size={group_size} but rewards have shape {x.shape}")
    return x
  if group_size is None:
    raise ValueError("flat rewards [N] need group_size")
  if group_size < 1 or x.shape[0] % group_size:
    raise ValueError(f"{x.shape[0]} rewards are not a multiple of group_size={group_size}")
  return x.reshape(-1, group_size)


def lower_median(x: jax.Array) -> jax.Array:
  """Lower median along the last axis (middle order statistic; torch.median semantics)."""
  return jnp.sort(x, axis=-1)[..., (x.shape[-1] - 1) // 2]


def group_advantages(
    rewards: jax.Array,
    *,
    group_size: int | None = None,
    config: AdvantageConfig = AdvantageConfig(),
) -> AdvantageOutput:
  """Group-normalised advantages (GRPO, Dr. GRPO, MC-GRPO depending on `config`).

  Args:
    rewards: float `[P * G]` (members of a group contiguous; pass `group_size`) or `[P, G]`.
      Integer/bool rewards are cast to float32; computation is in at least float32.
    group_size: G, required for flat rewards.
    config: baseline ("mean" | "median"), scale ("std" | "none" | "mad"), eps, ddof, mad_guard.

  Returns:
    `AdvantageOutput` with advantages and mask of the rewards' shape.

  Raises:
    TypeError: complex or non-numeric rewards.
    NonFiniteError: NaN/inf rewards (concrete rewards, or in checked mode).
  """
  checks.check_dtype(rewards, "group_advantages: rewards")
  rewards = jnp.asarray(rewards)
  checks.check_finite(rewards, "group_advantages: rewards")
  r = as_groups(rewards, group_size)
  dtype = jnp.promote_types(r.dtype, jnp.float32)
  r = r.astype(dtype)
  p, g = r.shape
  if g < 2:
    raise ValueError(f"groups need at least 2 members, got {g}")

  zero_var = jnp.all(r == r[:, :1], axis=-1)                       # [P]
  aux = {}
  if config.baseline == "mean":
    base = jnp.mean(r, axis=-1, keepdims=True)
    mask = jnp.ones_like(r)
  else:
    base = lower_median(r)[:, None]
    pivot = jnp.argmax(r == base, axis=-1)                           # lowest tied index
    mask = (jnp.arange(g)[None, :] != pivot[:, None]).astype(dtype)
    aux["pivot_index"] = pivot.astype(jnp.int32)
  centred = r - base

  if config.scale == "none":
    adv = centred
  else:
    if config.scale == "std":
      dev = r - jnp.mean(r, axis=-1, keepdims=True)
      scale = jnp.sqrt(jnp.sum(dev * dev, axis=-1, keepdims=True) / (g - config.ddof))
    else:
      scale = lower_median(jnp.abs(centred))[:, None]
    denom = scale + config.eps
    if config.scale == "mad" and config.mad_guard:
      denom = jnp.where(scale == 0, 1.0, denom)
    # Zero-variance groups have scale 0 and maybe eps 0: keep the division NaN-free.
    denom = jnp.where(zero_var[:, None], 1.0, denom)
    adv = centred / denom
  adv = jnp.where(zero_var[:, None], 0.0, adv)
  checks.check_finite(adv, "group_advantages: advantages")

  nzv = jnp.sum(zero_var).astype(jnp.int32)
  aux.update(
      zero_variance_groups=nzv,
      zero_variance_frac=nzv.astype(dtype) / p,
      zero_variance=zero_var,
      reward_mean=jnp.mean(r),
      reward_std=jnp.std(r),
  )
  aux = jax.tree.map(jax.lax.stop_gradient, aux)
  return AdvantageOutput(adv.reshape(rewards.shape), mask.reshape(rewards.shape), aux)


def mc_grpo_advantages(
    rewards: jax.Array,
    *,
    group_size: int | None = None,
    config: AdvantageConfig | None = None,
) -> AdvantageOutput:
  """MC-GRPO advantages: median baseline over G+1 samples, MAD scale, pivot masked out.

  Args:
    rewards: float `[P * (G+1)]` (pass `group_size=G+1`) or `[P, G+1]`; G+1 should be odd.
    group_size: G+1, required for flat rewards.
    config: defaults to `preset("mc_grpo")[0]` (median, mad, eps 1e-3, mad_guard=True); its
      baseline must be "median".

  Returns:
    `AdvantageOutput`; `mask` is 0 at each group's pivot. Multiply the response mask by it.
  """
  config = preset("mc_grpo")[0] if config is None else config
  if config.baseline != "median":
    raise ValueError(f"mc_grpo_advantages needs baseline='median', got {config.baseline!r}")
  return group_advantages(rewards, group_size=group_size, config=config)

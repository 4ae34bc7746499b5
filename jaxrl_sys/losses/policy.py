"""Policy losses of the PPO-clip family: GRPO, DAPO, Dr. GRPO, decoupled PPO (AReaL).

Per token (spec sections 1.2-1.4, 6), with A the advantage and u = exp(lp - old):

    pg = -min(u A, clip(u, 1 - eps_low, 1 + eps_high) A)
    dual clip (optional, A < 0):  pg = min(pg, -c A)
    decoupled PPO:                pg = sg(w) * pg,  w = exp(old - behav) (capped), `old` being
                                  the proximal policy's log-probs
    per_token = pg + kl_coef * k(lp, ref) - entropy_coef * entropy

then aggregated by `config.aggregation` (aggregation.py). The gradient of pg with respect to lp
is -A u where the unclipped branch is active (also exactly on the clip boundary) and 0 where
the clipped or dual-clipped branch is strictly smaller.

Masked positions of every `[batch, seq]` input may hold arbitrary values, NaN and inf included:
they are replaced before any arithmetic, so neither the loss nor its gradient sees them.
"""
import dataclasses

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.losses import checks
from jaxrl_sys.losses.aggregation import (LossOutput, aggregate, loss_numerator, masked_mean,
                                          safe_divide)
from jaxrl_sys.losses.config import PolicyLossConfig, preset
from jaxrl_sys.losses.ess import effective_sample_size, sequence_log_weights
from jaxrl_sys.losses.kl import kl_estimate


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    config: PolicyLossConfig = PolicyLossConfig(),
    ref_logprobs: jax.Array | None = None,
    behav_logprobs: jax.Array | None = None,
    entropy: jax.Array | None = None,
    denominator: jax.Array | float | None = None,
) -> LossOutput:
  """The one entry point: clipped policy loss + KL + entropy bonus, aggregated.

  Args:
    logprobs: float `[batch, seq]`, log pi_theta of the sampled tokens (differentiable).
    old_logprobs: float `[batch, seq]`, log-probs the ratio is anchored to (the proximal policy
      when `config.decoupled`); treated as constants.
    advantages: float `[batch]` (broadcast over tokens) or `[batch, seq]`; constants.
    mask: `[batch, seq]` bool or {0, 1} (other values raise, see `checks`); multiply in the
      MC-GRPO pivot mask beforehand.
    config: the loss configuration (`preset(name)[1]` for the algorithms' defaults).
    ref_logprobs: float `[batch, seq]`, reference policy; required when `config.kl_coef > 0`
      and `kl_where == "loss"`; if given it is always reported as `aux["kl"]`.
    behav_logprobs: float `[batch, seq]`, behaviour (rollout engine) log-probs; required iff
      `config.decoupled`.
    entropy: float `[batch, seq]`, per-token policy entropy (differentiable); required when
      `config.entropy_coef > 0`, reported when given.
    denominator: optional external denominator (e.g. `loss_denominator` of the whole batch,
      for gradient accumulation); replaces the local one. Must be finite and > 0 while the mask
      has a valid token (a static or concrete one is checked at once, a traced one in checked
      mode).

  Returns:
    `LossOutput(loss, numerator, denominator, aux)`; aux holds `pg_loss`, `clip_frac_low`,
    `clip_frac_high`, `clip_frac`, `dual_clip_frac`, `approx_kl` (k3 estimate of
    KL(pi_old || pi_theta)), `ratio_mean`, `ratio_max`, `num_tokens`, `num_sequences`, and
    when available `kl`, `entropy`, and for decoupled PPO `behav_weight_mean`,
    `behav_weight_capped_frac` and `ess` (VCPO effective sample size of the sequence weights
    pi_theta / pi_behav over the non-empty rows).
    All computation is in at least float32.

  Raises:
    TypeError: complex or non-numeric inputs (trace time).
    LossInputError: a bad static denominator (trace time); with concrete inputs or in checked
      mode also NaN/inf at valid positions (`NonFiniteError`), mask values other than 0 and 1,
      log-probabilities above 0 (see `losses.checks`).
  """
  chex.assert_rank([logprobs, old_logprobs, mask], 2)
  chex.assert_equal_shape([logprobs, old_logprobs, mask])
  chex.assert_rank(advantages, {1, 2})
  chex.assert_equal_shape_prefix([advantages, logprobs], advantages.ndim)
  for name, x in (("ref_logprobs", ref_logprobs), ("behav_logprobs", behav_logprobs),
                  ("entropy", entropy)):
    if x is not None:
      chex.assert_shape(x, logprobs.shape, custom_message=name)
  for name, x in (("logprobs", logprobs), ("old_logprobs", old_logprobs),
                  ("ref_logprobs", ref_logprobs), ("behav_logprobs", behav_logprobs),
                  ("entropy", entropy)):
    if x is not None:
      checks.check_dtype(x, f"policy_loss: {name}", allow_bool=False)
  checks.check_dtype(advantages, "policy_loss: advantages")
  checks.check_dtype(mask, "policy_loss: mask")
  checks.check_mask(mask, "policy_loss: mask")
  kl_in_loss = config.kl_coef > 0 and config.kl_where == "loss"
  if kl_in_loss and ref_logprobs is None:
    raise ValueError("kl_coef > 0 with kl_where='loss' needs ref_logprobs")
  if config.decoupled != (behav_logprobs is not None):
    raise ValueError("behav_logprobs must be given if and only if config.decoupled is True")
  if config.entropy_coef != 0 and entropy is None:
    raise ValueError("entropy_coef != 0 needs entropy")

  dtype = jnp.promote_types(logprobs.dtype, jnp.float32)
  valid = mask != 0
  if advantages.ndim == 1:
    advantages = advantages[:, None]
  advantages = jnp.broadcast_to(advantages, logprobs.shape)

  def clean(x, name, constant):
    checks.check_finite(x, f"policy_loss: {name}", valid)
    if name.endswith("logprobs"):
      checks.check_logprobs(x, f"policy_loss: {name}", valid)
    x = jnp.where(valid, x.astype(dtype), 0)
    return jax.lax.stop_gradient(x) if constant else x

  def clamp(log_ratio):
    c = config.logratio_clamp
    return log_ratio if c is None else jnp.clip(log_ratio, -c, c)

  lp = clean(logprobs, "logprobs", False)
  old = clean(old_logprobs, "old_logprobs", True)
  adv = clean(advantages, "advantages", True)

  log_ratio = clamp(lp - old)
  ratio = jnp.exp(log_ratio)
  low, high = 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high
  clipped_low = (adv < 0) & (ratio < low)
  clipped_high = (adv > 0) & (ratio > high)
  pg = jnp.where(clipped_low, -adv * low, jnp.where(clipped_high, -adv * high, -adv * ratio))
  if config.dual_clip_c is not None:
    dual = (adv < 0) & (ratio > config.dual_clip_c)
    pg = jnp.where(dual, -adv * config.dual_clip_c, pg)
  else:
    dual = jnp.zeros_like(valid)

  aux = {}
  if config.decoupled:
    behav = clean(behav_logprobs, "behav_logprobs", True)
    weight = jnp.exp(clamp(old - behav))
    capped = jnp.zeros_like(valid)
    if config.behav_weight_cap is not None:
      capped = weight > config.behav_weight_cap
      weight = (jnp.minimum(weight, config.behav_weight_cap)
                if config.behav_weight_cap_mode == "clamp" else jnp.where(capped, 0, weight))
    pg = weight * pg
    aux["ess"] = effective_sample_size(sequence_log_weights(lp, behav, valid),
                                       jnp.any(valid, axis=-1))
    aux["behav_weight_mean"] = masked_mean(weight, valid)
    aux["behav_weight_capped_frac"] = masked_mean(capped.astype(dtype), valid)

  per_token = pg
  if ref_logprobs is not None:
    ref = clean(ref_logprobs, "ref_logprobs", True)
    kl = kl_estimate(lp, ref, config.kl_estimator, clamp=config.logratio_clamp)
    aux["kl"] = masked_mean(kl, valid)
    if kl_in_loss:
      per_token = per_token + config.kl_coef * kl
  if entropy is not None:
    ent = clean(entropy, "entropy", False)
    aux["entropy"] = masked_mean(ent, valid)
    if config.entropy_coef != 0:
      per_token = per_token - config.entropy_coef * ent

  loss, numerator, denominator = aggregate(
      per_token, valid, config.aggregation,
      constant_length=config.drgrpo_constant_length, denominator=denominator)
  checks.check_finite(loss, "policy_loss: loss")

  pg_numerator = loss_numerator(pg, valid, config.aggregation)
  aux.update(
      pg_loss=safe_divide(pg_numerator, denominator),
      clip_frac_low=masked_mean(clipped_low.astype(dtype), valid),
      clip_frac_high=masked_mean(clipped_high.astype(dtype), valid),
      clip_frac=masked_mean((clipped_low | clipped_high).astype(dtype), valid),
      dual_clip_frac=masked_mean(dual.astype(dtype), valid),
      approx_kl=masked_mean(jnp.expm1(log_ratio) - log_ratio, valid),
      ratio_mean=masked_mean(ratio, valid),
      ratio_max=jnp.max(jnp.where(valid, ratio, 0)),
      num_tokens=jnp.sum(valid).astype(jnp.int32),
      num_sequences=jnp.sum(jnp.any(valid, axis=-1)).astype(jnp.int32),
  )
  aux = jax.tree.map(jax.lax.stop_gradient, aux)
  return LossOutput(loss, numerator, denominator, aux)


def _with_preset(name: str, overrides: dict) -> PolicyLossConfig:
  return dataclasses.replace(preset(name)[1], **overrides)


def grpo_loss(logprobs, old_logprobs, advantages, mask, *, ref_logprobs=None, entropy=None,
              denominator=None, **overrides) -> LossOutput:
  """GRPO loss: `policy_loss` with `preset("grpo")` (clip 0.2, k3 KL 0.04 in the loss,
  sequence-mean-token-mean). Keyword `overrides` replace config fields, e.g. `kl_coef=0.0`.
  Shapes as in `policy_loss`; `ref_logprobs` `[batch, seq]` is required while kl_coef > 0."""
  return policy_loss(logprobs, old_logprobs, advantages, mask,
                     config=_with_preset("grpo", overrides), ref_logprobs=ref_logprobs,
                     entropy=entropy, denominator=denominator)


def dapo_loss(logprobs, old_logprobs, advantages, mask, *, ref_logprobs=None, entropy=None,
              denominator=None, **overrides) -> LossOutput:
  """DAPO loss: `policy_loss` with `preset("dapo")` (clip-higher 0.2 / 0.28, token-mean, no
  KL). Keyword `overrides` replace config fields. Shapes as in `policy_loss`."""
  return policy_loss(logprobs, old_logprobs, advantages, mask,
                     config=_with_preset("dapo", overrides), ref_logprobs=ref_logprobs,
                     entropy=entropy, denominator=denominator)


def drgrpo_loss(logprobs, old_logprobs, advantages, mask, *, ref_logprobs=None, entropy=None,
                denominator=None, **overrides) -> LossOutput:
  """Dr. GRPO loss: `policy_loss` with `preset("drgrpo")` (masked sum / (rows * C)); pass
  `drgrpo_constant_length=` (the max completion length; default: padded length T).
  Shapes as in `policy_loss`."""
  return policy_loss(logprobs, old_logprobs, advantages, mask,
                     config=_with_preset("drgrpo", overrides), ref_logprobs=ref_logprobs,
                     entropy=entropy, denominator=denominator)


DECOUPLED_DEFAULTS = dict(decoupled=True, aggregation="token_mean", behav_weight_cap=5.0,
                          behav_weight_cap_mode="mask")


def decoupled_ppo_loss(logprobs, prox_logprobs, behav_logprobs, advantages, mask, *,
                       ref_logprobs=None, entropy=None, denominator=None,
                       **overrides) -> LossOutput:
  """Decoupled PPO (AReaL): trust region around the proximal policy, detached behaviour weight.

  Defaults: clip 0.2, token-mean, behaviour weight pi_prox / pi_behav with tokens above 5.0
  masked out (AReaL's former rejection-sampling default); `overrides` replace config fields
  (e.g. `behav_weight_cap=None`, `clip_eps_high=0.28`).

  Args:
    logprobs: float `[batch, seq]`, current policy (differentiable).
    prox_logprobs: float `[batch, seq]`, proximal policy (parameters before this update).
    behav_logprobs: float `[batch, seq]`, behaviour policy (the engine version per token).
    advantages: float `[batch]` or `[batch, seq]`.
    mask: `[batch, seq]` bool or {0, 1}.
    ref_logprobs, entropy, denominator: as in `policy_loss`.

  Returns:
    `LossOutput`.
  """
  config = PolicyLossConfig(**{**DECOUPLED_DEFAULTS, **overrides})
  return policy_loss(logprobs, prox_logprobs, advantages, mask, config=config,
                     ref_logprobs=ref_logprobs, behav_logprobs=behav_logprobs,
                     entropy=entropy, denominator=denominator)

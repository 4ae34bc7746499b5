"""VCPO's closed-form minimum-variance off-policy baseline, OPOB (spec section 3.3).

Minimising the variance of (1/N) sum_i w_i (R_i - b) grad log pi(tau_i) over a scalar b gives

    b* = sum_i W_i R_i / sum_i W_i,     W_i = w_i^2 ||grad_theta sum_t log pi(y_{i,t})||^2

per group (or over the whole batch). We use the paper's form, where the importance weight
enters once as w^2 (the reference code also folds the truncated IS weight of the loss into the
measured gradient, giving ~w^4; pass `sq_grad_norms * min(w, 8)**2` to reproduce that). W is
handled in log space (log W = 2 log w + log ||g||^2), so the baseline is invariant to the scale
of W and cannot overflow; a group whose W are all 0 falls back to the plain mean of its rewards.

`per_sequence_grad_sq_norms` gives the squared norms with one `jax.grad` per trajectory,
vectorised by `jax.vmap` (or `jax.lax.map` in chunks to bound memory to `chunk_size` copies
of the parameters' gradient).
"""
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.losses import checks
from jaxrl_sys.losses.advantages import AdvantageOutput, as_groups


def _groups(x, group_size):
  return x.reshape(1, -1) if group_size is None and x.ndim == 1 else as_groups(x, group_size)


def opob_baseline(
    rewards: jax.Array,
    sq_grad_norms: jax.Array,
    *,
    log_weights: jax.Array | None = None,
    group_size: int | None = None,
    valid: jax.Array | None = None,
) -> jax.Array:
  """Per-sample OPOB baseline b_g of each sample's group.

  Args:
    rewards: float `[N]` or `[P, G]`, raw rewards R_i (or any per-sample values).
    sq_grad_norms: float, same shape, ||grad sum_t log pi(tau_i)||^2 (>= 0).
    log_weights: optional float, same shape, log importance weights log w_i (default: on-policy,
      w = 1).
    group_size: G for flat inputs; None with flat inputs means one baseline for the batch.
    valid: optional bool, same shape; invalid samples get weight 0.

  Returns:
    float array of the rewards' shape: b of the sample's group, broadcast to its members.
  """
  rewards = jnp.asarray(rewards)
  chex.assert_equal_shape([rewards, sq_grad_norms])
  dtype = jnp.promote_types(jnp.result_type(rewards, sq_grad_norms), jnp.float32)
  checks.check_finite(rewards, "opob_baseline: rewards", valid)
  checks.check_finite(sq_grad_norms, "opob_baseline: sq_grad_norms", valid)
  r = _groups(rewards.astype(dtype), group_size)
  norms = _groups(jnp.asarray(sq_grad_norms, dtype), group_size)
  keep = norms > 0
  log_w2 = jnp.log(jnp.where(keep, norms, 1.0))
  if log_weights is not None:
    chex.assert_equal_shape([rewards, log_weights])
    lw = _groups(jnp.asarray(log_weights, dtype), group_size)
    log_w2 = log_w2 + 2 * jnp.where(lw > -jnp.inf, lw, 0.0)
    keep = keep & (lw > -jnp.inf)
  member = jnp.ones_like(keep) if valid is None else _groups(jnp.asarray(valid, bool),
                                                             group_size)
  keep = keep & member
  peak = jnp.max(jnp.where(keep, log_w2, -jnp.inf), axis=-1, keepdims=True)
  peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
  big_w = jnp.where(keep, jnp.exp(jnp.where(keep, log_w2 - peak, 0.0)), 0.0)
  total = jnp.sum(big_w, axis=-1, keepdims=True)
  weighted = jnp.sum(big_w * r, axis=-1, keepdims=True) / jnp.where(total > 0, total, 1.0)
  count = jnp.maximum(jnp.sum(member, axis=-1, keepdims=True), 1).astype(dtype)
  plain = jnp.sum(jnp.where(member, r, 0), axis=-1, keepdims=True) / count
  base = jnp.where(total > 0, weighted, plain)
  return jnp.broadcast_to(base, r.shape).reshape(rewards.shape)


def opob_advantages(
    rewards: jax.Array,
    sq_grad_norms: jax.Array,
    *,
    group_size: int | None = None,
    log_weights: jax.Array | None = None,
    valid: jax.Array | None = None,
    normalize_std: bool = True,
    std_threshold: float = 1e-8,
) -> AdvantageOutput:
  """Advantages with the OPOB baseline in place of the group mean (VCPO reference code).

      A_i = (R_i - b_g) / sigma_g   if normalize_std and sigma_g > std_threshold, else R_i - b_g

  with sigma_g the population std of the group's raw rewards (over valid members).

  Args:
    rewards, sq_grad_norms, log_weights, group_size, valid: as in `opob_baseline`.
    normalize_std: divide by the population std (reference default True).
    std_threshold: groups with std <= this are not divided.

  Returns:
    `AdvantageOutput(advantages, mask, aux)`: mask = valid as float (ones by default), aux
    holds `baseline` (rewards' shape) and `zero_variance_groups`.
  """
  rewards = jnp.asarray(rewards)
  base = opob_baseline(rewards, sq_grad_norms, log_weights=log_weights,
                       group_size=group_size, valid=valid)
  r = _groups(rewards.astype(base.dtype), group_size)
  member = (jnp.ones(r.shape, bool) if valid is None
            else _groups(jnp.asarray(valid, bool), group_size))
  centred = r - _groups(base, group_size)
  count = jnp.maximum(jnp.sum(member, axis=-1, keepdims=True), 1).astype(r.dtype)
  mean = jnp.sum(jnp.where(member, r, 0), axis=-1, keepdims=True) / count
  var = jnp.sum(jnp.where(member, (r - mean) ** 2, 0), axis=-1, keepdims=True) / count
  sigma = jnp.sqrt(var)
  divide = normalize_std & (sigma > std_threshold)
  adv = jnp.where(divide, centred / jnp.where(divide, sigma, 1.0), centred)
  adv = jnp.where(member, adv, 0.0).reshape(rewards.shape)
  aux = {"baseline": base,
         "zero_variance_groups": jnp.sum(sigma <= std_threshold).astype(jnp.int32)}
  aux = jax.tree.map(jax.lax.stop_gradient, aux)
  return AdvantageOutput(adv, member.astype(r.dtype).reshape(rewards.shape), aux)


def per_sequence_grad_sq_norms(
    token_logprob_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    mask: jax.Array,
    *,
    chunk_size: int | None = None,
) -> jax.Array:
  """||grad_params sum_t m_t log pi(y_t)||^2 for every sequence of a batch.

  Args:
    token_logprob_fn: `(params, x) -> [seq]` float per-token log-probs of ONE sequence, where
      `x` is one row (leading axis removed) of every leaf of `inputs`.
    params: pytree of parameters (gradients are taken with respect to all its leaves).
    inputs: pytree whose leaves have a leading batch axis `[batch, ...]`.
    mask: `[batch, seq]` bool or {0, 1}; which tokens enter the sum.
    chunk_size: if set, sequences are processed `chunk_size` at a time with `jax.lax.map`
      (peak memory ~ chunk_size gradients) instead of all at once with `jax.vmap`.

  Returns:
    float32 `[batch]` (float64 under x64 with float64 parameters).
  """
  chex.assert_rank(mask, 2)

  def one(x, m):
    def seq_logprob(p):
      lp = token_logprob_fn(p, x)
      chex.assert_shape(lp, m.shape)
      return jnp.sum(jnp.where(m != 0, lp, 0))

    grads = jax.grad(seq_logprob)(params)
    return sum(jnp.sum(jnp.square(g.astype(jnp.promote_types(g.dtype, jnp.float32))))
               for g in jax.tree.leaves(grads))

  if chunk_size is None:
    return jax.vmap(one)(inputs, mask)
  return jax.lax.map(lambda xm: one(*xm), (inputs, mask), batch_size=chunk_size)

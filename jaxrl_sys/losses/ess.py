"""VCPO effective sample size and the ESS-scaled learning rate (spec sections 3.1, 3.2).

Sequence importance weights w_i = exp(sum_t m (lp - mu)) over the B trajectories of one
optimizer step give

    ESS = (sum_i w_i)^2 / sum_i w_i^2,   rho = ESS / B,   s = min(1, rho / base_ess_ratio)
    lr_eff = lr * sqrt(s)  ("sqrt", default)  or  lr * s  ("linear")

ESS is computed in log space, log ESS = 2 LSE(log w) - LSE(2 log w) (after subtracting
max log w), so very stale, long sequences (log w in the hundreds) cannot overflow or lose
precision; the reference's `+1e-8` in the denominator
is then unnecessary and dropped. Weights are unclipped (the reference default).

`scale_by_ess()` is an optax transformation that multiplies the incoming updates by s. Put it
last in a chain, after the optimizer, so it scales the whole step, weight decay included,
exactly like scaling the learning rate:

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr), scale_by_ess())
    ...
    log_w = sequence_log_weights(logprobs, behav_logprobs, mask)    # current params, no grad
    ess = effective_sample_size(log_w)
    updates, opt_state = tx.update(grads, opt_state, params, ess=ess, num_sequences=B)

(`optax.chain` forwards keyword "extra args" to every member; `nnx.Optimizer.update(model,
grads, ess=..., num_sequences=...)` forwards them too.) Under `jax.jit` with global arrays the
ESS is already computed over all data-parallel shards of the step.
"""
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from jaxrl_sys.losses import checks

RULES = ("sqrt", "linear")


def sequence_log_weights(
    logprobs: jax.Array, behav_logprobs: jax.Array, mask: jax.Array) -> jax.Array:
  """log w_i = sum_t m_{i,t} (lp_{i,t} - mu_{i,t}).

  Args:
    logprobs: float `[batch, seq]`, learner's log-probs (current parameters).
    behav_logprobs: float `[batch, seq]`, behaviour (rollout engine) log-probs.
    mask: `[batch, seq]` bool or {0, 1}; masked positions may hold anything.

  Returns:
    float `[batch]` (at least float32).
  """
  chex.assert_rank([logprobs, behav_logprobs, mask], 2)
  chex.assert_equal_shape([logprobs, behav_logprobs, mask])
  checks.check_dtype(logprobs, "sequence_log_weights: logprobs", allow_bool=False)
  checks.check_dtype(behav_logprobs, "sequence_log_weights: behav_logprobs", allow_bool=False)
  checks.check_mask(mask, "sequence_log_weights: mask")
  valid = mask != 0
  checks.check_finite(logprobs, "sequence_log_weights: logprobs", valid)
  checks.check_finite(behav_logprobs, "sequence_log_weights: behav_logprobs", valid)
  dtype = jnp.promote_types(jnp.result_type(logprobs, behav_logprobs), jnp.float32)
  diff = logprobs.astype(dtype) - behav_logprobs.astype(dtype)
  return jnp.sum(jnp.where(valid, diff, 0), axis=-1)


def effective_sample_size(log_weights: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """ESS = (sum w)^2 / sum w^2 from log-weights, computed in log space.

  Args:
    log_weights: float `[batch]`, log w_i (e.g. from `sequence_log_weights`); -inf means w=0.
    valid: optional bool `[batch]`; invalid entries (padding rows) are left out.

  Returns:
    float scalar in [1, number of valid entries] (0 if none is valid or all w are 0).
  """
  chex.assert_rank(log_weights, 1)
  checks.check_dtype(log_weights, "effective_sample_size: log_weights", allow_bool=False)
  if log_weights.shape[0] == 0:
    raise ValueError("effective_sample_size: no log-weights (shape (0,)); the ESS of an empty "
                     "batch is undefined")
  log_weights = log_weights.astype(jnp.promote_types(log_weights.dtype, jnp.float32))
  checks.check_finite(jnp.where(log_weights == -jnp.inf, 0, log_weights),
                      "effective_sample_size: log_weights", valid)
  keep = log_weights > -jnp.inf
  if valid is not None:
    chex.assert_equal_shape([log_weights, valid])
    keep = keep & valid
  any_keep = jnp.any(keep)
  safe = jnp.where(keep, log_weights, -jnp.inf)
  safe = jnp.where(any_keep, safe, 0.0)        # keeps value and gradient NaN-free
  # ESS is invariant to a common shift of log w: centre on the max so both log-sum-exps are
  # small numbers and their difference keeps full precision even for log w ~ 1e3.
  safe = safe - jax.lax.stop_gradient(jnp.max(safe))
  log_ess = 2 * jax.nn.logsumexp(safe) - jax.nn.logsumexp(2 * safe)
  return jnp.where(any_keep, jnp.exp(log_ess), 0.0)


def ess_lr_scale(
    ess: jax.Array,
    num_sequences: jax.Array | int,
    *,
    base_ess_ratio: float = 1.0,
    rule: str = "sqrt",
) -> jax.Array:
  """Learning-rate multiplier s' from the ESS: sqrt(s) or s, s = min(1, ESS / B / base).

  Args:
    ess: float scalar.
    num_sequences: B, the number of sequences the ESS was computed over.
    base_ess_ratio: rho at and above which the learning rate is not reduced (default 1.0).
    rule: "sqrt" (default) or "linear".

  Returns:
    float scalar in [0, 1].
  """
  if rule not in RULES:
    raise ValueError(f"unknown rule {rule!r}; choose one of {RULES}")
  ess = jnp.asarray(ess)
  rho = ess / jnp.asarray(num_sequences, ess.dtype)
  s = jnp.minimum(1.0, rho / base_ess_ratio)
  return jnp.sqrt(s) if rule == "sqrt" else s


class ScaleByESSState(NamedTuple):
  """State of `scale_by_ess`: the multiplier applied at the last step (for logging)."""
  scale: jax.Array


def scale_by_ess(
    *, rule: str = "sqrt", base_ess_ratio: float = 1.0) -> optax.GradientTransformationExtraArgs:
  """Optax transformation multiplying the updates by the per-step ESS learning-rate scale.

  `update(updates, state, params=None, *, ess, num_sequences)` takes the step's ESS and B as
  extra keyword arguments (or `lr_scale=` with an already computed multiplier). Chain it after
  the optimizer, e.g. `optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr),
  scale_by_ess())`; the resulting update equals the optimizer's update times `ess_lr_scale`.

  Args:
    rule: "sqrt" or "linear" (see `ess_lr_scale`).
    base_ess_ratio: see `ess_lr_scale`.

  Returns:
    An `optax.GradientTransformationExtraArgs`; its state is `ScaleByESSState`.
  """
  if rule not in RULES:
    raise ValueError(f"unknown rule {rule!r}; choose one of {RULES}")

  def init_fn(params):
    del params
    return ScaleByESSState(scale=jnp.ones([], jnp.float32))

  def update_fn(updates, state, params=None, *, ess=None, num_sequences=None, lr_scale=None,
                **extra_args):
    del state, params, extra_args
    if lr_scale is None:
      if ess is None or num_sequences is None:
        raise TypeError("scale_by_ess: pass ess= and num_sequences= (or lr_scale=) to update()")
      lr_scale = ess_lr_scale(ess, num_sequences, base_ess_ratio=base_ess_ratio, rule=rule)
    lr_scale = jnp.asarray(lr_scale, jnp.float32)
    updates = jax.tree.map(lambda u: (u * lr_scale).astype(u.dtype), updates)
    return updates, ScaleByESSState(scale=lr_scale)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)

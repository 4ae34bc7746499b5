"""Per-token estimators of KL(pi_theta || pi_ref) from sampled tokens (spec section 1.3).

With log_r = ref - lp (tokens sampled from pi_theta):

    k1 = -log_r                       unbiased, can be negative; d/dlp = 1
    k2 = 0.5 * log_r ** 2             biased, >= 0;              d/dlp = -log_r
    k3 = exp(log_r) - 1 - log_r       unbiased, >= 0;            d/dlp = 1 - exp(log_r)

As a loss term the estimate is added per token and aggregated like the policy term
(`PolicyLossConfig.kl_where="loss"`). As a reward penalty it is summed over each response,
detached, and subtracted from the outcome reward before the advantages
(`kl_penalized_rewards`, `kl_where="reward"`).
"""
import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.losses import checks


def kl_estimate(
    logprobs: jax.Array,
    ref_logprobs: jax.Array,
    estimator: str = "k3",
    *,
    clamp: float | None = None,
) -> jax.Array:
  """Per-token KL estimate.

  Args:
    logprobs: float `[...]` (usually `[batch, seq]`), log-probs of the current policy.
    ref_logprobs: float, same shape, log-probs of the reference policy.
    estimator: "k1", "k2" or "k3".
    clamp: if set, log_r is clamped to [-clamp, clamp] first (overflow guard for k3).

  Returns:
    float array of the input shape (dtype promoted to at least float32). Masking is the
    caller's job.
  """
  chex.assert_equal_shape([logprobs, ref_logprobs])
  checks.check_dtype(logprobs, "kl_estimate: logprobs", allow_bool=False)
  checks.check_dtype(ref_logprobs, "kl_estimate: ref_logprobs", allow_bool=False)
  dtype = jnp.promote_types(jnp.result_type(logprobs, ref_logprobs), jnp.float32)
  log_r = ref_logprobs.astype(dtype) - logprobs.astype(dtype)
  if clamp is not None:
    log_r = jnp.clip(log_r, -clamp, clamp)
  if estimator == "k1":
    return -log_r
  if estimator == "k2":
    return 0.5 * log_r * log_r
  if estimator == "k3":
    return jnp.expm1(log_r) - log_r
  raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")


def kl_penalized_rewards(
    rewards: jax.Array,
    logprobs: jax.Array,
    ref_logprobs: jax.Array,
    mask: jax.Array,
    *,
    coef: float,
    estimator: str = "k3",
    clamp: float | None = 20.0,
) -> jax.Array:
  """Outcome rewards minus a detached, per-response KL penalty.

      r'_i = r_i - coef * sum_t m_{i,t} k(lp_{i,t}, ref_{i,t})

  Args:
    rewards: float `[batch]`.
    logprobs: float `[batch, seq]`, log-probs of the sampling policy.
    ref_logprobs: float `[batch, seq]`.
    mask: `[batch, seq]` bool or {0, 1}; masked positions may hold any value (even NaN).
    coef: beta.
    estimator: "k1", "k2" or "k3".
    clamp: log-ratio clamp (see `kl_estimate`).

  Returns:
    float `[batch]`, no gradient flows through the penalty.
  """
  chex.assert_rank([rewards, logprobs], [1, 2])
  chex.assert_equal_shape([logprobs, ref_logprobs, mask])
  chex.assert_equal_shape_prefix([rewards, logprobs], 1)
  checks.check_dtype(rewards, "kl_penalized_rewards: rewards")
  checks.check_mask(mask, "kl_penalized_rewards: mask")
  valid = mask != 0
  checks.check_finite(logprobs, "kl_penalized_rewards: logprobs", valid)
  checks.check_finite(ref_logprobs, "kl_penalized_rewards: ref_logprobs", valid)
  kl = kl_estimate(jnp.where(valid, logprobs, 0), jnp.where(valid, ref_logprobs, 0),
                   estimator, clamp=clamp)
  penalty = coef * jnp.sum(jnp.where(valid, kl, 0), axis=-1)
  return rewards.astype(penalty.dtype) - jax.lax.stop_gradient(penalty)

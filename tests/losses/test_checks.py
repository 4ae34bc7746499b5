"""Checked mode (NaN/inf raise), host-side reward validation, configs and presets."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from jaxrl_sys import losses as L


def batch(b=3, t=4):
  rng = np.random.default_rng(0)
  lp = rng.normal(-1, 0.3, (b, t)).astype(np.float32)
  mask = np.arange(t)[None] < np.array([4, 2, 3])[:, None]
  return lp, (lp + 0.1).astype(np.float32), np.array([1.0, -1.0, 0.5], np.float32), mask


checked_loss = L.checked(L.policy_loss)


def test_checked_policy_loss_raises_on_nan_and_inf_at_valid_positions():
  lp, old, adv, mask = batch()
  config = L.PolicyLossConfig(kl_coef=0.1)
  out = checked_loss(lp, old, adv, mask, config=config, ref_logprobs=old)
  unchecked = jax.jit(L.policy_loss)(lp, old, adv, mask, config=config, ref_logprobs=old)
  np.testing.assert_allclose(out.loss, unchecked.loss, rtol=1e-6)
  with pytest.raises(L.NonFiniteError, match=r"logprobs has 1 non-finite.*index \(1, 1\)"):
    checked_loss(_set(lp, (1, 1), np.nan), old, adv, mask, config=config, ref_logprobs=old)
  with pytest.raises(L.NonFiniteError, match="ref_logprobs"):
    checked_loss(lp, old, adv, mask, config=config, ref_logprobs=_set(old, (0, 3), np.inf))
  with pytest.raises(L.NonFiniteError, match="advantages"):
    checked_loss(lp, old, _set(adv, 2, -np.inf), mask, config=config, ref_logprobs=old)
  # Garbage at masked positions is fine: the loss is finite and unchanged.
  masked_nan = checked_loss(_set(lp, (1, 3), np.nan), old, adv, mask, config=config,
                            ref_logprobs=_set(old, (1, 2), np.inf))
  np.testing.assert_allclose(masked_nan.loss, out.loss)


def _set(x, index, value):
  y = np.array(x, copy=True)
  y[index] = value
  return y


def test_checked_advantages_raise_and_unchecked_functions_carry_no_checks():
  r = np.array([1.0, 0.0, np.nan, 1.0], np.float32)
  with pytest.raises(L.NonFiniteError, match=r"rewards has 1 non-finite.*index \(2\)"):
    L.checked(L.group_advantages)(r, group_size=2)
  with pytest.raises(L.NonFiniteError, match="rewards"):
    L.checked(L.mc_grpo_advantages)(np.array([0, 1, np.inf], np.float32), group_size=3)
  # Unchecked, jitted: no checkify machinery needed (and the NaN propagates).
  out = jax.jit(L.group_advantages, static_argnames="group_size")(r, group_size=2)
  assert np.isnan(np.asarray(out.advantages)[2])


def test_enable_checks_inside_a_trainers_own_checkified_step():
  lp, old, adv, mask = batch()

  def step(lp):
    return jax.grad(lambda x: L.dapo_loss(x, old, adv, mask).loss)(lp)

  with L.enable_checks():
    checked_step = jax.jit(checkify.checkify(step, errors=checkify.user_checks))
    err, _ = checked_step(lp)
  err.throw()
  err, _ = checked_step(_set(lp, (0, 0), np.nan))
  with pytest.raises(checkify.JaxRuntimeError, match="logprobs"):
    err.throw()


def test_validate_rewards_names_offending_indices():
  np.testing.assert_array_equal(L.validate_rewards([1, 0, 1]), [1.0, 0.0, 1.0])
  with pytest.raises(ValueError, match=r"2 non-finite value\(s\) at indices \[1, 3\]"):
    L.validate_rewards(np.array([0.0, np.nan, 1.0, np.inf]))
  with pytest.raises(ValueError, match=r"indices \[\(1, 0\)\]"):
    L.validate_rewards(np.array([[0.0, 1.0], [np.nan, 1.0]]))
  with pytest.raises(ValueError, match="multiple"):
    L.validate_rewards(np.zeros(5), group_size=2)
  with pytest.raises(ValueError, match="numeric"):
    L.validate_rewards(np.array(["a", "b"]))


def test_presets_and_config_validation():
  assert L.PRESETS == ("grpo", "dapo", "drgrpo", "mc_grpo", "vcpo")
  adv, loss = L.preset("grpo")
  assert (adv.ddof, adv.eps, loss.kl_estimator, loss.kl_coef) == (1, 1e-6, "k3", 0.04)
  assert L.preset("dapo")[1].clip_eps_high == 0.28 and L.preset("dapo")[1].kl_coef == 0
  assert L.preset("drgrpo")[0].scale == "none"
  assert L.preset("mc_grpo")[0] == L.AdvantageConfig(baseline="median", scale="mad", eps=1e-3)
  assert L.preset("vcpo")[1].clip_eps_high == 1e9
  with pytest.raises(ValueError, match="unknown preset"):
    L.preset("ppo")
  for bad in (dict(clip_eps_low=1.5), dict(dual_clip_c=1.0), dict(kl_estimator="k4"),
              dict(kl_where="both"), dict(behav_weight_cap=0.0), dict(logratio_clamp=-1.0),
              dict(drgrpo_constant_length=0), dict(behav_weight_cap_mode="drop")):
    with pytest.raises(ValueError):
      L.PolicyLossConfig(**bad)
  with pytest.raises(dataclasses.FrozenInstanceError):
    loss.kl_coef = 1.0
  # Configs are static pytrees: usable as jit arguments, part of the cache key.
  f = jax.jit(lambda x, config: x * config.kl_coef)
  assert float(f(jnp.ones(()), loss)) == pytest.approx(0.04)


# ----- issue 44: inputs a loss cannot mean raise (eagerly, at trace time, or in checked mode) --
def test_static_and_concrete_denominators_are_checked_under_jit_too():
  lp, old, adv, mask = batch()
  for den in (0.0, -4.0, float("nan"), np.float32(0)):
    with pytest.raises(L.LossInputError, match="denominator"):
      L.grpo_loss(lp, old, adv, mask, kl_coef=0.0, denominator=den)
    with pytest.raises(L.LossInputError, match="denominator"):
      jax.jit(lambda a, d=den: L.grpo_loss(a, old, adv, mask, kl_coef=0.0, denominator=d))(lp)
  # 0 is right for a batch without a valid token (the loss is 0 either way)
  out = L.grpo_loss(lp, old, adv, np.zeros_like(mask), kl_coef=0.0, denominator=0.0)
  assert float(out.loss) == 0.0
  # a traced denominator is checked in checked mode
  fn = L.checked(lambda a, d: L.grpo_loss(a, old, adv, mask, kl_coef=0.0, denominator=d).loss)
  np.testing.assert_allclose(fn(lp, np.float32(9.0)), L.grpo_loss(
      lp, old, adv, mask, kl_coef=0.0, denominator=9.0).loss, rtol=1e-6)
  with pytest.raises(L.LossInputError, match="denominator"):
    fn(lp, np.float32(0.0))


@pytest.mark.parametrize("scale", [2.0, -1.0])
def test_masks_other_than_0_and_1_raise(scale):
  lp, old, adv, mask = batch()
  bad = mask.astype(np.float32) * scale
  with pytest.raises(L.LossInputError, match=r"mask has \d+ value\(s\) other than 0 and 1"):
    L.grpo_loss(lp, old, adv, bad, kl_coef=0.0)
  with pytest.raises(L.LossInputError, match="other than 0 and 1"):
    L.loss_denominator(bad, "token_mean")
  with pytest.raises(L.LossInputError, match="other than 0 and 1"):
    checked_loss(lp, old, adv, bad)
  # a {0, 1} float or int mask is the bool mask
  np.testing.assert_allclose(L.grpo_loss(lp, old, adv, mask.astype(np.int32), kl_coef=0.0).loss,
                             L.grpo_loss(lp, old, adv, mask, kl_coef=0.0).loss)


def test_probabilities_passed_as_logprobs_raise():
  lp, old, adv, mask = batch()
  with pytest.raises(L.LossInputError, match=r"logprobs has \d+ value\(s\) above 0"):
    L.grpo_loss(np.exp(lp), np.exp(old), adv, mask, kl_coef=0.0)
  with pytest.raises(L.LossInputError, match="old_logprobs.*above 0"):
    checked_loss(lp, np.exp(old), adv, mask)
  # above 0 only at masked positions: fine
  padded = np.where(mask, lp, 0.7).astype(np.float32)
  L.grpo_loss(padded, old, adv, mask, kl_coef=0.0)


def test_complex_and_non_numeric_inputs_raise_at_trace_time():
  lp, old, adv, mask = batch()
  with pytest.raises(TypeError, match="rewards is complex"):
    L.group_advantages(np.array([1 + 1j, 0, 1, 0]), group_size=2)
  with pytest.raises(TypeError, match="rewards is complex"):
    jax.jit(lambda r: L.group_advantages(r, group_size=2))(jnp.array([1 + 1j, 0, 1, 0]))
  with pytest.raises(TypeError, match="advantages is complex"):
    jax.jit(lambda a: L.grpo_loss(lp, old, a, mask, kl_coef=0.0))(adv.astype(np.complex64))
  with pytest.raises(TypeError, match="logprobs has dtype bool"):
    L.grpo_loss(mask, old, adv, mask, kl_coef=0.0)
  with pytest.raises(ValueError, match="real numeric"):
    L.validate_rewards(np.array([1 + 1j, 0]))
  with pytest.raises(ValueError, match="empty batch"):
    L.effective_sample_size(jnp.zeros((0,)))

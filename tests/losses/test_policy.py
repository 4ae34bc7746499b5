"""Policy losses: values vs NumPy, gradients vs finite differences, masking, micro-batches."""
import dataclasses
import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys import losses as L
from tests.losses import np_reference as ref_np

# Every aggregation mode, clip form, KL estimator / placement, entropy and decoupled option
# appears in at least one variant (few variants: each one costs an XLA compilation).
VARIANTS = {
    "grpo_k3": dict(kl_coef=0.04, kl_estimator="k3"),
    "dapo_k1": dict(clip_eps_high=0.28, aggregation="token_mean", kl_coef=0.1,
                    kl_estimator="k1"),
    "drgrpo_const_k2": dict(aggregation="seq_mean_token_sum_norm", drgrpo_constant_length=16,
                            kl_coef=0.1, kl_estimator="k2"),
    "drgrpo_padded_kl_reward_entropy": dict(aggregation="seq_mean_token_sum_norm",
                                            kl_coef=0.1, kl_where="reward", entropy_coef=0.01),
    "seq_token_sum_dual_clip": dict(aggregation="seq_mean_token_sum", dual_clip_c=2.0),
    "decoupled": dict(decoupled=True, aggregation="token_mean"),
    "decoupled_clamp": dict(decoupled=True, behav_weight_cap=1.2),
    "decoupled_mask_everything": dict(
        decoupled=True, behav_weight_cap=1.2, behav_weight_cap_mode="mask",
        clip_eps_high=0.28, dual_clip_c=2.0, kl_coef=0.05, entropy_coef=0.02),
}


def make_batch(seed, *, b=6, t=9, token_adv=False, garbage="finite"):
  """Random inputs with padding; masked positions hold `garbage` ("finite", "nan", "inf")."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, t + 1, b)
  lengths[0], lengths[1] = t, 0                            # a full row and an empty row
  mask = np.arange(t)[None, :] < lengths[:, None]
  lp = rng.normal(-1.5, 0.5, (b, t))
  batch = dict(
      lp=lp, old=lp + rng.normal(0, 0.5, (b, t)), ref=lp + rng.normal(0, 0.5, (b, t)),
      behav=lp + rng.normal(0, 0.5, (b, t)), ent=rng.uniform(0, 2, (b, t)),
      adv=rng.normal(size=(b, t) if token_adv else b))
  batch["adv"][0], batch["adv"][2] = np.abs(batch["adv"][0]), -np.abs(batch["adv"][2])
  fill = {"finite": lambda shape: rng.normal(0, 50, shape), "nan": lambda s: np.full(s, np.nan),
          "inf": lambda s: np.full(s, np.inf)}[garbage]
  for k in ("lp", "old", "ref", "behav", "ent"):
    batch[k] = np.where(mask, batch[k], fill((b, t)))
  if token_adv:
    batch["adv"] = np.where(mask, batch["adv"], fill((b, t)))
  batch = {k: v.astype(np.float32) for k, v in batch.items()}
  batch["mask"] = mask
  return batch


@jax.jit
def loss_and_grads(lp, old, adv, mask, ref, behav, ent, config, denominator=None):
  def f(lp, ent):
    out = L.policy_loss(lp, old, adv, mask, config=config, ref_logprobs=ref,
                        behav_logprobs=behav, entropy=ent, denominator=denominator)
    return out.loss, out
  (_, out), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(lp, ent)
  return out, grads


def run(batch, config, denominator=None, cast=jnp.asarray):
  behav = cast(batch["behav"]) if config.decoupled else None
  return loss_and_grads(cast(batch["lp"]), cast(batch["old"]), cast(batch["adv"]),
                        jnp.asarray(batch["mask"]), cast(batch["ref"]), behav,
                        cast(batch["ent"]), config, denominator)


def numpy_loss(batch, kwargs):
  return ref_np.policy_loss(
      batch["lp"], batch["old"], batch["adv"], batch["mask"], ref=batch["ref"],
      entropy=batch["ent"], behav=batch["behav"] if kwargs.get("decoupled") else None,
      **kwargs)


@pytest.mark.parametrize("name,token_adv", [(n, False) for n in sorted(VARIANTS)] + [
    ("grpo_k3", True), ("decoupled_mask_everything", True)])
def test_values_match_numpy(name, token_adv):
  kwargs = VARIANTS[name]
  batch = make_batch(1, token_adv=token_adv)
  out, _ = run(batch, L.PolicyLossConfig(**kwargs))
  loss, num, den, metrics = numpy_loss(batch, kwargs)
  np.testing.assert_allclose(out.loss, loss, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.numerator, num, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.denominator, den, rtol=1e-6)
  for key, value in metrics.items():
    np.testing.assert_allclose(out.aux[key], value, rtol=1e-6, atol=1e-6, err_msg=key)
  assert int(out.aux["num_sequences"]) == int(batch["mask"].any(-1).sum())
  assert int(out.aux["num_tokens"]) == int(batch["mask"].sum())


def test_batch_exercises_every_clip_branch():
  batch = make_batch(1)
  out, _ = run(batch, L.PolicyLossConfig(**VARIANTS["decoupled_mask_everything"]))
  for key in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "behav_weight_capped_frac"):
    assert 0 < out.aux[key] < 1, key


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_gradients_match_finite_differences(name):
  config = L.PolicyLossConfig(**VARIANTS[name])
  batch = make_batch(2)
  with jax.enable_x64(True):
    cast = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    _, (g_lp, g_ent) = run(batch, config, cast=cast)
    assert g_lp.dtype == jnp.float64
    mask = batch["mask"]
    assert np.all(np.asarray(g_lp)[~mask] == 0) and np.all(np.asarray(g_ent)[~mask] == 0)
    rng = np.random.default_rng(0)
    h = 1e-6
    for _ in range(2):
      v_lp, v_ent = rng.normal(size=mask.shape) * mask, rng.normal(size=mask.shape) * mask

      def f(s):
        shifted = dict(batch, lp=batch["lp"] + s * v_lp, ent=batch["ent"] + s * v_ent)
        return float(run(shifted, config, cast=cast)[0].loss)

      fd = (f(h) - f(-h)) / (2 * h)
      analytic = float(np.sum(g_lp * v_lp) + np.sum(g_ent * v_ent))
      np.testing.assert_allclose(analytic, fd, rtol=1e-6, atol=1e-8)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**16), garbage=st.sampled_from(["finite", "nan", "inf"]))
def test_masked_tokens_never_change_loss_or_gradient(seed, garbage):
  config = L.PolicyLossConfig(**VARIANTS["decoupled_mask_everything"])
  clean = make_batch(seed, token_adv=True, garbage="finite")
  dirty = make_batch(seed, token_adv=True, garbage=garbage)
  out_c, g_c = run(clean, config)
  out_d, g_d = run(dirty, config)
  assert np.isfinite(float(out_d.loss))
  np.testing.assert_array_equal(out_c.loss, out_d.loss)
  for a, b in zip(g_c, g_d):
    np.testing.assert_array_equal(a, b)
  for key in out_c.aux:
    np.testing.assert_array_equal(out_c.aux[key], out_d.aux[key], err_msg=key)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**16))
def test_decoupled_equals_ppo_clip_when_proximal_is_behaviour(seed):
  batch = make_batch(seed)
  batch["behav"] = batch["old"]
  decoupled = VARIANTS["decoupled_clamp"]
  ppo, g_ppo = run(batch, L.PolicyLossConfig(**dict(decoupled, decoupled=False)))
  dec, g_dec = run(batch, L.PolicyLossConfig(**decoupled))
  np.testing.assert_allclose(dec.loss, ppo.loss, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(g_dec[0], g_ppo[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["grpo_k3", "dapo_k1", "drgrpo_const_k2",
                                  "seq_token_sum_dual_clip"])  # the four aggregation modes
def test_micro_batches_sum_to_full_batch(name):
  config = L.PolicyLossConfig(**VARIANTS[name])
  batch = make_batch(1)
  full, (g_full, _) = run(batch, config)
  denominator = L.loss_denominator(batch["mask"], config)
  np.testing.assert_allclose(denominator, full.denominator)
  parts = [{k: v[i:i + 2] for k, v in batch.items()} for i in range(0, 6, 2)]
  external = [run(p, config, denominator=denominator) for p in parts]
  num = sum(float(o.numerator) for o, _ in external)
  den = sum(float(L.loss_denominator(p["mask"], config)) for p in parts)
  np.testing.assert_allclose(num / den, full.loss, rtol=1e-6)
  np.testing.assert_allclose(sum(float(o.loss) for o, _ in external), full.loss, rtol=1e-6)
  g_micro = np.concatenate([np.asarray(g[0]) for _, g in external])
  np.testing.assert_allclose(g_micro, g_full, rtol=1e-6, atol=1e-9)


def test_named_wrappers_use_their_presets():
  b = make_batch(4)
  args = (b["lp"], b["old"], b["adv"], b["mask"])
  for fn, name in ((L.grpo_loss, "grpo"), (L.dapo_loss, "dapo"), (L.drgrpo_loss, "drgrpo")):
    got = jax.jit(fn)(*args, ref_logprobs=b["ref"])
    want = numpy_loss(b, dataclasses.asdict(L.preset(name)[1]))[0]
    np.testing.assert_allclose(got.loss, want, rtol=1e-6, atol=1e-6, err_msg=name)
  got = jax.jit(functools.partial(L.grpo_loss, kl_coef=0.0, clip_eps_high=0.3))(*args)
  want = numpy_loss(b, dict(clip_eps_high=0.3))[0]
  np.testing.assert_allclose(got.loss, want, rtol=1e-6, atol=1e-6)
  got = jax.jit(L.decoupled_ppo_loss)(b["lp"], b["old"], b["behav"], b["adv"], b["mask"])
  want = numpy_loss(b, dict(decoupled=True, aggregation="token_mean", behav_weight_cap=5.0,
                            behav_weight_cap_mode="mask"))[0]
  np.testing.assert_allclose(got.loss, want, rtol=1e-6, atol=1e-6)


def test_vmap_over_batches_and_bf16_inputs():
  bs = [make_batch(s) for s in (5, 6)]
  stack = lambda k: jnp.stack([jnp.asarray(b[k]) for b in bs])  # noqa: E731
  f = lambda lp, old, adv, mask: L.dapo_loss(lp, old, adv, mask).loss  # noqa: E731
  batched = jax.jit(jax.vmap(f))(stack("lp"), stack("old"), stack("adv"), stack("mask"))
  for i, b in enumerate(bs):
    want = numpy_loss(b, dataclasses.asdict(L.preset("dapo")[1]))[0]
    np.testing.assert_allclose(batched[i], want, rtol=1e-6, atol=1e-6)
  b = bs[0]
  out = jax.jit(f)(jnp.asarray(b["lp"], jnp.bfloat16), b["old"], b["adv"], b["mask"])
  assert out.dtype == jnp.float32 and np.isfinite(float(out))


def test_logratio_clamp_bounds_ratio_and_zeroes_gradient():
  lp = jnp.array([[30.0, 0.1]])
  old = jnp.zeros((1, 2))
  mask = jnp.ones((1, 2), bool)
  config = L.PolicyLossConfig(clip_eps_low=1.0, clip_eps_high=1e9)
  f = lambda x: L.policy_loss(x, old, jnp.array([-1.0]), mask, config=config)  # noqa: E731
  (_, out), g = jax.jit(jax.value_and_grad(lambda x: (f(x).loss, f(x)), has_aux=True))(lp)
  np.testing.assert_allclose(out.aux["ratio_max"], np.exp(20.0), rtol=1e-6)
  assert g[0, 0] == 0 and g[0, 1] != 0


def test_all_masked_batch_gives_zero_loss_and_gradient():
  b = make_batch(7)
  mask = np.zeros_like(b["mask"])
  for name in ("grpo_k3", "dapo_k1"):
    out, (g, _) = run(dict(b, mask=mask), L.PolicyLossConfig(**VARIANTS[name]))
    assert float(out.loss) == 0 and float(out.denominator) == 0 and not np.any(g)


def test_argument_errors():
  b = make_batch(8)
  args = (b["lp"], b["old"], b["adv"], b["mask"])
  with pytest.raises(ValueError, match="ref_logprobs"):
    L.policy_loss(*args, config=L.PolicyLossConfig(kl_coef=0.1))
  with pytest.raises(ValueError, match="behav_logprobs"):
    L.policy_loss(*args, config=L.PolicyLossConfig(decoupled=True))
  with pytest.raises(ValueError, match="behav_logprobs"):
    L.policy_loss(*args, behav_logprobs=b["behav"])
  with pytest.raises(ValueError, match="entropy"):
    L.policy_loss(*args, config=L.PolicyLossConfig(entropy_coef=0.1))
  with pytest.raises(AssertionError):
    L.policy_loss(b["lp"][:, :4], *args[1:])
  with pytest.raises(ValueError, match="aggregation"):
    dataclasses.replace(L.PolicyLossConfig(), aggregation="mean")


def test_kl_estimators_and_reward_penalty():
  rng = np.random.default_rng(9)
  lp, ref = rng.normal(-1, 0.5, (3, 5)), rng.normal(-1, 0.5, (3, 5))
  lp32, ref32 = lp.astype(np.float32), ref.astype(np.float32)
  derivs = {"k1": lambda lr: np.ones_like(lr), "k2": lambda lr: -lr,
            "k3": lambda lr: 1 - np.exp(lr)}
  for est, deriv in derivs.items():
    np.testing.assert_allclose(L.kl_estimate(lp32, ref32, est), ref_np.kl(lp32, ref32, est),
                               rtol=1e-6, atol=1e-6)
    with jax.enable_x64(True):
      g = jax.grad(lambda x: jnp.sum(L.kl_estimate(x, jnp.asarray(ref), est)))(jnp.asarray(lp))
      np.testing.assert_allclose(g, deriv(ref - lp), rtol=1e-12)
  mask = np.arange(5)[None] < np.array([[5], [2], [0]])
  rewards = np.array([1.0, 0.0, 0.5], np.float32)
  got = L.kl_penalized_rewards(rewards, np.where(mask, lp, np.nan), ref, mask, coef=0.1)
  want = rewards - 0.1 * np.sum(np.where(mask, ref_np.kl(lp, ref, "k3"), 0), axis=-1)
  np.testing.assert_allclose(got, want, rtol=1e-6)

"""VCPO: ESS, the ESS learning-rate scale as an optax transformation, OPOB and grad norms."""
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_sys import losses as L
from tests.losses import np_reference as ref_np

ess_jit = jax.jit(L.effective_sample_size)
opob_jit = jax.jit(L.opob_baseline, static_argnames="group_size")


def test_sequence_log_weights_and_ess_match_numpy():
  rng = np.random.default_rng(0)
  lp, mu = rng.normal(-1, 0.3, (8, 6)), rng.normal(-1, 0.3, (8, 6))
  mask = np.arange(6)[None] < rng.integers(1, 7, 8)[:, None]
  lw = jax.jit(L.sequence_log_weights)(np.where(mask, lp, np.nan).astype(np.float32),
                                       mu.astype(np.float32), mask)
  want_lw = np.sum(np.where(mask, lp - mu, 0), -1)
  np.testing.assert_allclose(lw, want_lw, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ess_jit(lw), ref_np.ess(want_lw), rtol=1e-6)
  valid = np.arange(8) < 5
  np.testing.assert_allclose(ess_jit(lw, valid), ref_np.ess(want_lw[:5]), rtol=1e-6)


def test_ess_log_space_does_not_overflow_and_has_fd_gradient():
  x = np.random.default_rng(1).normal(size=8).astype(np.float32)
  shifted = x + np.float32(800.0)    # exp(800) overflows float32 and float64
  got = ess_jit(shifted)
  assert np.isfinite(float(got))
  np.testing.assert_allclose(got, ref_np.ess(shifted.astype(np.float64) - 800.0), rtol=1e-5)
  np.testing.assert_allclose(ess_jit(jnp.full(4, -jnp.inf)), 0.0)
  with jax.enable_x64(True):
    x64 = jnp.asarray(x, jnp.float64)
    v = np.random.default_rng(2).normal(size=8)
    g = jax.jit(jax.grad(L.effective_sample_size))(x64)
    h = 1e-6
    fd = (ess_jit(x64 + h * v) - ess_jit(x64 - h * v)) / (2 * h)
    np.testing.assert_allclose(np.sum(g * v), fd, rtol=1e-6, atol=1e-9)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(c=st.floats(-1e3, 1e3), hot=st.integers(0, 7))
def test_ess_equal_weights_is_batch_size_and_one_hot_is_one(c, hot):
  np.testing.assert_allclose(ess_jit(jnp.full(8, c, jnp.float32)), 8.0, rtol=1e-5)
  one_hot = jnp.full(8, -jnp.inf).at[hot].set(c)
  np.testing.assert_allclose(ess_jit(one_hot), 1.0, rtol=1e-6)
  nearly = jnp.full(8, c - 200.0).at[hot].set(c)
  np.testing.assert_allclose(ess_jit(nearly), 1.0, rtol=1e-6)


def test_ess_lr_scale_rules():
  np.testing.assert_allclose(L.ess_lr_scale(16.0, 64), 0.5)
  np.testing.assert_allclose(L.ess_lr_scale(16.0, 64, rule="linear"), 0.25)
  np.testing.assert_allclose(L.ess_lr_scale(16.0, 64, base_ess_ratio=0.5), np.sqrt(0.5))
  np.testing.assert_allclose(L.ess_lr_scale(60.0, 64, base_ess_ratio=0.5), 1.0)
  with pytest.raises(ValueError, match="rule"):
    L.ess_lr_scale(1.0, 2, rule="cube")


@pytest.mark.parametrize("rule", ["sqrt", "linear"])
def test_scale_by_ess_composes_with_adamw(rule):
  params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
  base = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
  scaled = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1),
                       L.scale_by_ess(rule=rule))
  s_base, s_scaled = base.init(params), scaled.init(params)
  step_base = jax.jit(base.update)
  step_scaled = jax.jit(lambda g, s, p, e: scaled.update(g, s, p, ess=e, num_sequences=64))
  rng = np.random.default_rng(0)
  for ess in (64.0, 16.0, 1.0):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    u_base, s_base = step_base(grads, s_base, params)
    u_scaled, s_scaled = step_scaled(grads, s_scaled, params, ess)
    factor = np.sqrt(ess / 64) if rule == "sqrt" else ess / 64
    for a, b in zip(jax.tree.leaves(u_scaled), jax.tree.leaves(u_base)):
      np.testing.assert_allclose(a, np.asarray(b) * factor, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(s_scaled[-1].scale, factor, rtol=1e-6)
    params = optax.apply_updates(params, u_base)
  u, _ = jax.jit(lambda g, s, p: scaled.update(g, s, p, lr_scale=0.5))(grads, s_scaled, params)
  np.testing.assert_allclose(u["w"], np.asarray(step_base(grads, s_base, params)[0]["w"]) * 0.5,
                             rtol=1e-6)
  with pytest.raises(TypeError, match="ess="):
    scaled.update(grads, s_scaled, params)


def test_opob_matches_numpy():
  rng = np.random.default_rng(3)
  r = rng.integers(0, 2, 16).astype(np.float64) + rng.normal(0, 0.1, 16)
  norms = rng.uniform(0.5, 4.0, 16)
  lw = rng.normal(0, 0.5, 16)
  f32 = lambda x: x.astype(np.float32)  # noqa: E731
  base_np, adv_np = ref_np.opob(r, norms, np.exp(lw), 4)
  got = opob_jit(f32(r), f32(norms), log_weights=f32(lw), group_size=4)
  np.testing.assert_allclose(got, base_np, rtol=1e-6, atol=1e-6)
  out = jax.jit(L.opob_advantages, static_argnames="group_size")(
      f32(r), f32(norms), log_weights=f32(lw), group_size=4)
  np.testing.assert_allclose(out.advantages, adv_np, rtol=1e-5, atol=1e-6)
  whole, _ = ref_np.opob(r, norms, np.ones(16), 16)
  np.testing.assert_allclose(opob_jit(f32(r), f32(norms)), whole, rtol=1e-6)
  # Log space: huge weights do not overflow; the baseline only depends on relative W.
  np.testing.assert_allclose(
      opob_jit(f32(r), f32(norms), log_weights=f32(lw + 300.0), group_size=4),
      base_np, rtol=1e-5, atol=1e-6)
  # All W = 0 (zero gradients): fall back to the plain group mean.
  np.testing.assert_allclose(opob_jit(f32(r), np.zeros(16, np.float32), group_size=4),
                             np.repeat(r.reshape(4, 4).mean(-1), 4), rtol=1e-6)


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_per_sequence_grad_sq_norms_match_analytic(chunk_size):
  rng = np.random.default_rng(4)
  b, t, d, v = 5, 4, 3, 7
  x = rng.normal(size=(b, t, d)).astype(np.float32)
  y = rng.integers(0, v, (b, t))
  mask = np.arange(t)[None] < np.array([4, 1, 3, 0, 2])[:, None]
  params = {"w": rng.normal(size=(d, v)).astype(np.float32)}

  def token_logprobs(p, inp):
    xs, ys = inp
    logp = jax.nn.log_softmax(xs @ p["w"])
    return jnp.take_along_axis(logp, ys[:, None], axis=-1)[:, 0]

  got = jax.jit(lambda p, i, m: L.per_sequence_grad_sq_norms(
      token_logprobs, p, i, m, chunk_size=chunk_size))(params, (x, y), mask)
  want = []
  for i in range(b):
    logits = x[i].astype(np.float64) @ params["w"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    grad = sum(np.outer(x[i, s], np.eye(v)[y[i, s]] - probs[s]) for s in range(t) if mask[i, s])
    want.append(np.sum(np.square(grad)) if mask[i].any() else 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

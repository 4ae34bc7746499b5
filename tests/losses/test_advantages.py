"""Group advantages (GRPO, Dr. GRPO, MC-GRPO) against NumPy, properties and edge cases."""
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys import losses as L
from tests.losses import np_reference as ref_np

CONFIGS = {
    "grpo": L.AdvantageConfig(),
    "grpo_ddof0": L.AdvantageConfig(ddof=0, eps=1e-4),
    "drgrpo": L.AdvantageConfig(scale="none"),
    "mc_grpo": L.preset("mc_grpo")[0],
    "mc_grpo_reference": L.AdvantageConfig(baseline="median", scale="mad", eps=1e-3,
                                           mad_guard=False),
    "median_std": L.AdvantageConfig(baseline="median", scale="std"),
    "mean_mad": L.AdvantageConfig(scale="mad"),
}
G = 5

advantages = jax.jit(L.group_advantages, static_argnames="group_size")


def rewards_batch(seed=0):
  """Groups of 5: continuous, binary (MAD 0), all-correct, all-wrong, ties at the median."""
  rng = np.random.default_rng(seed)
  return np.concatenate([
      rng.normal(size=G), rng.normal(size=G), [1, 0, 0, 1, 0], [1, 1, 1, 1, 1],
      [0, 0, 0, 0, 0], [0.5, 2, 0.5, -1, 0.5], [2, 0, 2, 0, 1]]).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_values_match_numpy(name):
  config = CONFIGS[name]
  r = rewards_batch()
  out = advantages(r, group_size=G, config=config)
  want, mask, n_zero = ref_np.group_advantages(
      r, G, baseline=config.baseline, scale=config.scale, eps=config.eps, ddof=config.ddof,
      mad_guard=config.mad_guard)
  np.testing.assert_allclose(out.advantages, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(out.mask, mask)
  assert int(out.aux["zero_variance_groups"]) == n_zero == 2
  np.testing.assert_array_equal(out.aux["zero_variance"], [0, 0, 0, 1, 1, 0, 0])
  two_d = advantages(r.reshape(-1, G), config=config)
  np.testing.assert_allclose(two_d.advantages, np.asarray(out.advantages).reshape(-1, G),
                             rtol=1e-6, atol=1e-6)


def test_mc_grpo_pivot_and_mad_choices():
  r = jnp.array([1, 0, 1, 0, 1, 0, 0, 1, 0, 0.0])
  out = jax.jit(L.mc_grpo_advantages, static_argnames="group_size")(r, group_size=G)
  # Median 1 (resp. 0); the pivot is the lowest index equal to it.
  np.testing.assert_array_equal(out.aux["pivot_index"], [0, 0])
  np.testing.assert_array_equal(out.mask, [0, 1, 1, 1, 1, 0, 1, 1, 1, 1])
  # MAD is 0 for binary rewards: guarded scale 1 vs the reference's 1 / 1e-3.
  np.testing.assert_allclose(out.advantages, [0, -1, 0, -1, 0, 0, 0, 1, 0, 0])
  ref = advantages(r, group_size=G, config=CONFIGS["mc_grpo_reference"])
  np.testing.assert_allclose(ref.advantages, np.asarray(out.advantages) * 1000, rtol=1e-6)
  with pytest.raises(ValueError, match="median"):
    L.mc_grpo_advantages(r, group_size=G, config=L.AdvantageConfig())


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "mc_grpo_reference"])
def test_gradients_match_finite_differences(name):
  config = CONFIGS[name]
  r = np.random.default_rng(1).normal(size=4 * G)
  v = np.random.default_rng(2).normal(size=(2, 4 * G))
  with jax.enable_x64(True):
    f = jax.jit(lambda x, w: jnp.sum(w * L.group_advantages(x, group_size=G,
                                                            config=config).advantages))
    g = jax.jit(jax.grad(f))(jnp.asarray(r), jnp.asarray(v[0]))
    h = 1e-6
    fd = (f(r + h * v[1], v[0]) - f(r - h * v[1], v[0])) / (2 * h)
    np.testing.assert_allclose(np.sum(g * v[1]), fd, rtol=1e-6, atol=1e-8)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    rewards=st.lists(st.integers(-4, 4), min_size=4 * G, max_size=4 * G),
    shifts=st.lists(st.floats(-50, 50), min_size=4, max_size=4))
def test_grpo_advantage_invariant_to_group_constant(rewards, shifts):
  r = np.asarray(rewards, np.float32).reshape(4, G) * 0.5
  shifted = r + np.asarray(shifts, np.float32)[:, None]
  a = advantages(r, config=CONFIGS["grpo"])
  b = advantages(shifted, config=CONFIGS["grpo"])
  np.testing.assert_allclose(b.advantages, a.advantages, atol=1e-4)
  np.testing.assert_array_equal(a.aux["zero_variance"], b.aux["zero_variance"])


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(value=st.floats(-1e6, 1e6, allow_subnormal=False),
                  name=st.sampled_from(["mc_grpo", "mc_grpo_reference"]))
def test_mc_grpo_equal_rewards_give_zero_advantage(value, name):
  r = np.full((3, G), value, np.float32)
  out = advantages(r, config=CONFIGS[name])
  assert np.all(np.asarray(out.advantages) == 0)
  np.testing.assert_array_equal(out.mask[:, 0], 0)
  np.testing.assert_array_equal(np.asarray(out.mask).sum(-1), G - 1)
  assert int(out.aux["zero_variance_groups"]) == 3


def test_vmap_and_shape_errors():
  r = jnp.asarray(rewards_batch()).reshape(7, G)
  batched = jax.jit(jax.vmap(
      lambda x: L.group_advantages(x, config=CONFIGS["grpo"]).advantages))(r[:, None, :])
  np.testing.assert_allclose(batched[:, 0, :], advantages(r, config=CONFIGS["grpo"]).advantages,
                             rtol=1e-6)
  with pytest.raises(ValueError, match="group_size"):
    L.group_advantages(jnp.zeros(10))
  with pytest.raises(ValueError, match="multiple"):
    L.group_advantages(jnp.zeros(10), group_size=3)
  with pytest.raises(ValueError, match="at least 2"):
    L.group_advantages(jnp.zeros((4, 1)))
  with pytest.raises(ValueError, match="scale"):
    L.AdvantageConfig(scale="batch")

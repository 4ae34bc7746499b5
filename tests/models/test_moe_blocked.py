"""The block-sparse CPU expert path against the dense all-experts einsum (values and gradients)."""
import dataclasses
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys import models
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.models.moe import blocked as moe_blocked
from jaxrl_sys.models.moe import experts as moe_experts


# The tests' inputs and references are jitted: run op by op, each random draw, softmax and
# einsum of each shape would be compiled on its own (most of these tests' compile time).
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _experts(e=4, d=16, f=8, seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return {"w_gate": 0.3 * jax.random.normal(ks[0], (e, d, f)),
          "w_up": 0.3 * jax.random.normal(ks[1], (e, d, f)),
          "w_down": 0.3 * jax.random.normal(ks[2], (e, f, d))}


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _routing(n, e, k, seed, skew=0.0, drop_every=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 2)
  logits = jax.random.normal(ks[0], (n, e)) + skew * jnp.arange(e)[None, :]
  g, experts = jax.lax.top_k(jax.nn.softmax(logits), k)
  active = jnp.ones((n, k), bool)
  if drop_every:
    active = active & (jnp.arange(n * k).reshape(n, k) % drop_every != 0)
  gates = jnp.where(active, g / g.sum(-1, keepdims=True), 0.0)
  return experts.astype(jnp.int32), gates, active


@pytest.mark.parametrize("n,e,k,block,skew,drop", [
    (24, 4, 2, 8, 0.0, 0),      # balanced
    (24, 4, 2, 8, 50.0, 0),     # every token on the same two experts (one block per 8 rows)
    (37, 4, 2, 16, 0.0, 3),     # ragged count, inactive assignments (padding / capacity drops)
    (5, 8, 1, None, 0.0, 0),    # fewer tokens than experts, default block size
])
def test_blocked_equals_dense_values_and_grads(n, e, k, block, skew, drop):
  experts, gates, active = _routing(n, e, k, seed=n, skew=skew, drop_every=drop)
  assert_matches_dense(lambda p, x, g: moe_blocked.blocked_experts(p, x, experts, g, active,
                                                                   block=block),
                       e, n, experts, gates, active)


@functools.partial(jax.jit, static_argnums=0)
def _tokens(n):
  return jax.random.normal(jax.random.PRNGKey(7), (n, 16))


def assert_matches_dense(fn, e, n, experts, gates, active):
  """`fn(p, x, gates)` (jitted) equals the dense all-experts einsum in values and in gradients
  w.r.t. the weights, the tokens and the active gates."""
  p = _experts(e)
  x = _tokens(n)

  def loss(f, p, x, gates):
    y = f(p, x, gates)
    return jnp.sum(y * jnp.cos(y))

  def dense(p, x, gates):
    return moe_experts.dense_experts(p, x, experts, jnp.where(active, gates, 0.0))

  np.testing.assert_allclose(jax.jit(fn)(p, x, gates), jax.jit(dense)(p, x, gates), atol=1e-5)
  g_ref = jax.jit(jax.grad(lambda *a: loss(dense, *a), argnums=(0, 1, 2)))(p, x, gates)
  g_got = jax.jit(jax.grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2)))(p, x, gates)
  g_ref = (g_ref[0], g_ref[1], jnp.where(active, g_ref[2], 0.0))
  g_got = (g_got[0], g_got[1], jnp.where(active, g_got[2], 0.0))
  for a, b in zip(jax.tree_util.tree_leaves(g_got), jax.tree_util.tree_leaves(g_ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_layout_places_every_active_assignment_once_in_its_experts_block():
  n, e, k, block = 30, 4, 2, 8
  experts, _, active = _routing(n, e, k, seed=3, skew=2.0, drop_every=4)
  lay = jax.device_get(moe_blocked.block_layout(experts, active, e, block))
  rows = moe_blocked.num_blocks(n * k, e, block) * block
  flat_e, flat_a = np.asarray(experts).reshape(-1), np.asarray(active).reshape(-1)
  live = lay.row[flat_a]
  assert len(set(live.tolist())) == flat_a.sum() and (live < rows).all()
  assert (lay.row[~flat_a] == rows).all()
  np.testing.assert_array_equal(lay.block_expert[live // block], flat_e[flat_a])
  np.testing.assert_array_equal(lay.src[live], (np.arange(n * k) // k)[flat_a])
  assert (np.delete(lay.src, live) == n).all()                    # the rest is padding
  np.testing.assert_array_equal(lay.owner[live], np.flatnonzero(flat_a))
  assert (np.delete(lay.owner, live) == n * k).all()
  loads = np.bincount(flat_e[flat_a], minlength=e)
  assert int(lay.used) == int(np.sum(-(-loads // block)))         # blocks holding assignments
  assert live.max() < int(lay.used) * block


def test_block_size_bounds_padding():
  assert moe_blocked.block_size(5120, 8) == 128
  assert moe_blocked.block_size(128, 8) == 8
  for a, e in ((5120, 8), (128, 8), (3000, 64)):
    b = moe_blocked.block_size(a, e)
    assert b == 8 or e * b * 4 <= a


def test_auto_model_matches_dense():
  assert moe.resolve_implementation("ragged", 21, 4) == "ragged"
  cfg = models.ModelConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, intermediate_size=64, max_seq_len=32,
                           moe=models.MoEConfig(num_experts=4, num_experts_per_tok=2,
                                                expert_intermediate_size=16))
  assert cfg.moe.implementation == "auto"
  toks = jax.random.randint(jax.random.PRNGKey(1), (3, 7), 1, 48)
  mask = jnp.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7, [1, 1, 1, 0, 0, 0, 0]])
  assert_model_matches_dense(cfg, toks, mask)


def assert_model_matches_dense(cfg, toks, mask):
  """A jitted forward + gradient of the model `cfg` equals the same with `implementation="dense"`
  (loss over the real tokens of `toks [batch, seq]` under `mask`)."""
  dense = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, implementation="dense"))
  params = models.init_params(cfg, jax.random.PRNGKey(0))

  def loss(p, c):
    h = models.forward(p, c, toks, attention_mask=mask).hidden
    return jnp.sum(jnp.where(mask[..., None] > 0, h, 0.0) ** 2)

  vg = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  ref, g_ref = vg(params, dense)
  got, g_got = vg(params, cfg)
  np.testing.assert_allclose(float(got), float(ref), rtol=1e-5)
  # float32 sums taken in another order: the error scales with a leaf's largest entry (the
  # loss is ~500), not with each entry, so the tolerance is relative to the leaf's maximum.
  for a, b in zip(jax.tree_util.tree_leaves(g_got), jax.tree_util.tree_leaves(g_ref)):
    b = np.asarray(b)
    np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=1e-4 * np.abs(b).max())

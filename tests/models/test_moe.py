"""MoE routing, balancing and expert implementations against independent references."""
import dataclasses
import itertools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys import models, sharding
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.models.moe import routing as moe_routing
from tests.precision_helpers import needs_devices


def _cfg(**moe_kw):
  m = dict(num_experts=4, num_experts_per_tok=2, expert_intermediate_size=16)
  m.update(moe_kw)
  return models.ModelConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=8, intermediate_size=64, max_seq_len=32,
                            moe=models.MoEConfig(**m))


def test_aux_free_bias_update_matches_rule():
  bias = jnp.array([[0.0, 0.1, -0.2, 0.0]])
  load = jnp.array([[10.0, 2.0, 4.0, 4.0]])          # mean 5
  got = moe_routing.aux_free_bias_update(bias, load, 0.01)
  np.testing.assert_allclose(np.asarray(got), [[-0.01, 0.11, -0.19, 0.01]], atol=1e-7)
  cfg = _cfg(balancing="aux_free", bias_update_rate=0.01)
  st = moe.init_moe_state(cfg)
  new = moe.update_moe_state(st, {"load": jnp.array([[10.0, 2, 4, 4], [5, 5, 5, 5]]),
                                  "q": st.q}, cfg)
  np.testing.assert_allclose(np.asarray(new.bias), [[-0.01, 0.01, 0.01, 0.01], [0, 0, 0, 0]])


def test_bias_changes_selection_but_never_gate_weights():
  scores = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(0), (16, 4)), -1)
  valid = jnp.ones(16, bool)
  bias = jnp.array([0.0, 5.0, 0.0, 0.0])   # forces expert 1 into every top-2
  r = moe_routing.route(scores, valid, k=2, norm_topk_prob=False, balancing="aux_free", bias=bias)
  assert (np.asarray(r.experts) == 1).any(axis=1).all()
  want = np.take_along_axis(np.asarray(scores), np.asarray(r.experts), axis=1)
  np.testing.assert_allclose(np.asarray(r.gates), want, rtol=1e-6)   # unbiased scores
  g = jax.grad(lambda b: moe_routing.route(scores, valid, k=2, norm_topk_prob=True,
                                           balancing="aux_free", bias=b).gates.sum())(bias)
  assert np.all(np.asarray(g) == 0)


@pytest.mark.parametrize("seed", range(6))
def test_bip_routing_equals_brute_force_integer_optimum(seed):
  n, m, k = 6, 3, 1
  cap = 2                                    # k n / m
  s = np.random.default_rng(seed).random((n, m)).astype(np.float32)
  best = -1.0
  for assign in itertools.product(range(m), repeat=n):
    if max(np.bincount(assign, minlength=m)) <= cap:
      best = max(best, sum(s[i, a] for i, a in enumerate(assign)))
  r = moe_routing.route(jnp.asarray(s), jnp.ones(n, bool), k=k, norm_topk_prob=False,
                        balancing="bip", bip_iterations=8)
  got = np.asarray(r.experts)[:, 0]
  assert np.bincount(got, minlength=m).max() <= cap
  assert abs(sum(s[i, a] for i, a in enumerate(got)) - best) < 1e-5


def test_bip_keeps_skewed_routing_within_capacity():
  key = jax.random.PRNGKey(3)
  logits = jax.random.normal(key, (256, 16)) + jnp.linspace(0, 3, 16)[None, :]   # skewed
  scores = jax.nn.softmax(logits, -1)
  valid = jnp.ones(256, bool)
  plain = moe_routing.route(scores, valid, k=2, norm_topk_prob=True)
  q = jnp.zeros(16)
  for _ in range(3):   # warm-started across steps, as in training
    r = moe_routing.route(scores, valid, k=2, norm_topk_prob=True, balancing="bip", q=q,
                          bip_iterations=8)
    q = r.q
  cap = 2 * 256 / 16
  assert float(moe_routing.max_violation(plain.load)) > 1.0
  assert np.asarray(r.load).max() <= cap * 1.05


def test_capacity_factor_drops_exactly_the_overflow():
  scores = jnp.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.4, 0.6]])
  r = moe_routing.route(scores, jnp.ones(4, bool), k=1, norm_topk_prob=False, capacity_factor=1.0)
  # capacity ceil(1 * 1 * 4 / 2) = 2: expert 0 is chosen by tokens 0, 1, 2 -> token 2 dropped
  np.testing.assert_array_equal(np.asarray(r.active)[:, 0], [True, True, False, True])
  assert float(r.dropped) == 1.0 and float(r.gates[2, 0]) == 0.0


def test_ragged_and_dense_experts_agree_with_padding():
  cfg = _cfg(num_shared_experts=1, shared_intermediate_size=16)
  dense = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, implementation="dense"))
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  toks = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 1, 48)
  mask = jnp.array([[0, 0, 1, 1, 1, 1], [1] * 6])
  fwd = jax.jit(models.forward, static_argnums=1)     # op by op, every op compiles alone
  a = fwd(params, cfg, toks, attention_mask=mask)
  b = fwd(params, dense, toks, attention_mask=mask)
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(a.hidden)[valid], np.asarray(b.hidden)[valid], atol=1e-5)
  np.testing.assert_allclose(np.asarray(a.aux["load"]).sum(-1), 2 * 10.0)   # padding not counted


@needs_devices(8)
def test_expert_parallel_forward_and_grads_equal_single_device():
  cfg = _cfg(num_experts=8)
  ep = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, implementation="expert_parallel"))
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  toks = jax.random.randint(jax.random.PRNGKey(1), (8, 4), 1, 48)

  def loss(p, c):
    return jnp.mean(models.forward(p, c, toks).hidden ** 2)

  ref, gref = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, cfg)
  mesh = sharding.make_mesh("1x8")
  with jax.set_mesh(mesh):
    got, g = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, ep)
  np.testing.assert_allclose(float(got), float(ref), rtol=1e-5)
  for x, y in zip(jax.tree_util.tree_leaves(gref), jax.tree_util.tree_leaves(g)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-5)

"""MoE routing replay and batch-independent routing, against independent references.

References: the model's own routing (forcing it back must change nothing, bit for bit), a float64
numpy MoE layer on the forced experts, histograms of the forced assignment, chunked routing
(per-token routing of a batch equals that of any split of it), and the single-device forward
for the expert-parallel path.
"""
import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys import models, sharding
from jaxrl_sys.models.moe import Routes
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.models.moe import routing as moe_routing
from tests.precision_helpers import needs_devices

# The shapes of tests/models/test_moe.py, with BIP balancing and a capacity limit.
CFG = models.ModelConfig(
    vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    intermediate_size=64, max_seq_len=32,
    moe=models.MoEConfig(num_experts=4, num_experts_per_tok=2, expert_intermediate_size=16,
                         balancing="bip", capacity_factor=1.0))
TOKS = jax.random.randint(jax.random.PRNGKey(1), (4, 12), 1, 48)
MASK = jnp.ones((4, 12), jnp.int32).at[0, 9:].set(0)


@pytest.fixture(scope="module")
def setup():
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  params = jax.tree.map(lambda x: x * 3.0 if x.ndim > 1 else x, params)   # a decisive router
  return params, moe.init_moe_state(CFG)


def _loss(p, state, routes):
  out = models.forward(p, CFG, TOKS, attention_mask=MASK, moe_state=state, routes=routes,
                       return_routes=True)
  return jnp.sum(out.hidden ** 2 * MASK[..., None]), out


_GRAD = jax.jit(jax.value_and_grad(_loss, has_aux=True))
# The same under remat: the recompute sees the same routes (they are an argument).
_GRAD_REMAT = jax.jit(jax.value_and_grad(jax.checkpoint(_loss), has_aux=True))


def test_forcing_own_routes_is_bit_identical_and_keeps_router_gradients(setup):
  params, state = setup
  for fn in (_GRAD, _GRAD_REMAT):
    (l0, live), g0 = fn(params, state, None)
    routes = live.routes
    assert routes.experts.dtype == jnp.uint8 and routes.experts.shape == (4, 12, 2, 2)
    assert not bool(jnp.all(routes.active[MASK > 0]))      # the capacity dropped some
    # One program (routes given, as the trainer's batches give them), live vs forced: bit for bit.
    (l1, free), g1 = fn(params, state, routes._replace(mask=jnp.zeros((4, 12), bool)))
    (l2, out), g2 = fn(params, state, routes)
    assert float(l2) == float(l1) == float(l0)
    for a, b in ((live.hidden, free.hidden), (live.hidden, out.hidden)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b, c in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), jax.tree.leaves(g2)):
      np.testing.assert_array_equal(np.asarray(c), np.asarray(b))
      # Against the program without routes: float32 rounding (XLA compiles the two programs
      # apart; at XLA:CPU's default flags they agree bit for bit too).
      np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-5, atol=1e-8)
    for k in ("load", "dropped", "q"):
      np.testing.assert_array_equal(np.asarray(out.aux[k]), np.asarray(live.aux[k]))
    np.testing.assert_array_equal(np.asarray(out.aux["replay_agree"]),
                                  np.asarray(out.aux["replayed"]))   # agreement 1 per layer
    assert float(jnp.sum(free.aux["replayed"])) == 0.0
  router = np.asarray(g2["layers"]["moe"]["router"])
  assert np.mean(router != 0) > 0.5 and np.abs(router).max() > 1e-4


def _np_layer(p, h, experts, active):
  """float64 reference of one MoE layer on given experts (softmax gating, renormalised over
  the k chosen, then dropped assignments weigh 0)."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  h = np.asarray(h, np.float64)
  logits = h @ p["router"]
  scores = np.exp(logits - logits.max(-1, keepdims=True))
  scores /= scores.sum(-1, keepdims=True)
  out = np.zeros_like(h)
  for i in range(h.shape[0]):
    g = scores[i, experts[i]]
    g = g / g.sum() * active[i]
    for gate, e in zip(g, experts[i]):
      a, u = h[i] @ p["w_gate"][e], h[i] @ p["w_up"][e]
      out[i] += gate * ((a / (1 + np.exp(-a))) * u) @ p["w_down"][e]
  return out


def test_forced_layer_matches_a_float64_reference_and_counts_the_replayed_load(setup):
  params, state = setup
  p = jax.tree.map(lambda x: x[0], params["layers"]["moe"])
  h = jax.random.normal(jax.random.PRNGKey(2), (1, 10, 32))
  rng = np.random.default_rng(0)
  forced = np.stack([rng.choice(4, 2, replace=False) for _ in range(10)]).astype(np.uint8)
  mask = np.ones((1, 10), bool)
  mask[0, 7:] = False                          # the last three route live
  f = jax.jit(lambda p, h, e, m: moe.moe_block(p, h, CFG, jax.tree.map(lambda x: x[0], state),
                                               forced=moe.Forced(e, m), return_experts=True))
  out, aux = f(p, h, forced[None], mask)
  live, active = np.asarray(aux["experts"])[0], np.asarray(aux["active"])[0]
  np.testing.assert_array_equal(live[:7], forced[:7])
  assert active[:7].all()                       # forced assignments are never dropped
  want = _np_layer(p, np.asarray(h)[0], live, active)
  np.testing.assert_allclose(np.asarray(out)[0], want, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(aux["load"]), np.bincount(live.reshape(-1),
                                                                     minlength=4))
  assert float(aux["replayed"]) == 14.0
  # Router gradients at the forced experts are non-zero (gates from the live scores).
  g = jax.grad(lambda r: jnp.sum(f(dict(p, router=r), h, forced[None], mask)[0] ** 2))(
      p["router"])
  assert np.abs(np.asarray(g)).max() > 1e-4


def test_per_token_routing_does_not_depend_on_the_batch():
  logits = jax.random.normal(jax.random.PRNGKey(3), (512, 16)) + jnp.linspace(0, 2, 16)
  scores = jax.nn.softmax(logits, -1)
  q = jnp.abs(jax.random.normal(jax.random.PRNGKey(4), (16,))) * 0.1
  kw = dict(k=2, norm_topk_prob=True, balancing="bip", q=q, bip_iterations=4,
            capacity_factor=1.0)

  @jax.jit
  def both(s):
    whole = [moe_routing.route(s, jnp.ones(len(s), bool), per_token=pt, **kw) for pt in (1, 0)]
    chunks = jax.vmap(lambda c: moe_routing.route(c, jnp.ones(8, bool), per_token=True,
                                                  **kw))(s.reshape(64, 8, 16))
    return whole, chunks

  (tok, batch), chunks = both(scores)
  np.testing.assert_array_equal(np.asarray(tok.experts),
                                np.asarray(chunks.experts).reshape(512, 2))
  assert bool(jnp.all(tok.active)) and float(tok.dropped) == 0.0
  # Independent reference: top-2 of s - q per token.
  want = np.argsort(-(np.asarray(scores) - np.asarray(q)), axis=1, kind="stable")[:, :2]
  np.testing.assert_array_equal(np.sort(np.asarray(tok.experts), 1), np.sort(want, 1))
  # Batch routing (BIP sweeps, capacity over the batch) is what made routes batch-dependent.
  assert np.mean(np.any(np.asarray(batch.experts) != np.asarray(tok.experts), 1)) > 0.2


@needs_devices(2)
def test_expert_parallel_replays_like_a_single_device(setup):
  _, state = setup
  params = models.init_params(CFG, jax.random.PRNGKey(0))   # unscaled: well conditioned
  (_, live), gref = _GRAD(params, state, None)
  routes = live.routes._replace(experts=(live.routes.experts + 1) % 4)   # other experts
  (lref, oref), gref = _GRAD(params, state, routes)
  ep = dataclasses.replace(CFG, moe=dataclasses.replace(
      CFG.moe, implementation="expert_parallel", ep_dispatch="ragged_emulated"))

  def loss(p):
    out = models.forward(p, ep, TOKS, attention_mask=MASK, moe_state=state, routes=routes)
    return jnp.sum(out.hidden ** 2 * MASK[..., None]), out.hidden

  with jax.set_mesh(sharding.make_mesh("1x2")):
    (lgot, hgot), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  np.testing.assert_allclose(float(lgot), float(lref), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(hgot), np.asarray(oref.hidden), atol=1e-5)
  for a, b in zip(jax.tree.leaves(gref), jax.tree.leaves(g)):   # norm-wise: another sum order
    a, b = np.asarray(a), np.asarray(b)
    assert np.linalg.norm(b - a) <= 1e-4 * np.linalg.norm(a)


def test_bad_routes_are_refused_with_the_expected_shape(setup):
  params, _ = setup
  with pytest.raises(ValueError, match=r"needs \[batch, seq, layers, k\] = \[4, 12, 2, 2\]"):
    models.forward(params, CFG, TOKS, routes=Routes(jnp.zeros((4, 12, 2, 1), jnp.uint8)))

"""The training forward: the unrolled layer loop equals the scanned one (hidden, aux, grads)."""
import numpy as np

import jax
import jax.numpy as jnp

from jaxrl_sys import models


def test_unrolled_layers_equal_scanned_layers():
  cfg = models.ModelConfig(vocab_size=48, hidden_size=32, num_layers=3, num_heads=4,
                           num_kv_heads=2, head_dim=8, intermediate_size=64, max_seq_len=32,
                           moe=models.MoEConfig(num_experts=4, num_experts_per_tok=2,
                                                expert_intermediate_size=16))
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  state = models.moe.init_moe_state(cfg)
  toks = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 1, 48)

  def run(p, unroll):
    out = models.forward(p, cfg, toks, moe_state=state, unroll_layers=unroll)
    return jnp.sum(out.hidden ** 2), out.aux

  vg = jax.jit(jax.value_and_grad(run, has_aux=True), static_argnums=1)
  (a, aux_a), g_a = vg(params, False)
  (b, aux_b), g_b = vg(params, True)
  np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
  for x, y in zip(jax.tree_util.tree_leaves((aux_a, g_a)), jax.tree_util.tree_leaves((aux_b, g_b))):
    # jitted: the two programs fuse differently, so allow float32 reassociation noise
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-4)

"""The train step with LoRA: only the adapters change (the base is bit for bit the same, by
hash), the optimizer holds the adapters' moments only, the KL reference is the base, and the
adapters' gradient equals the gradient through merged weights (an independent reference)."""

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import LoraConfig
from jaxrl_sys.sharding import make_mesh
from jaxrl_sys.train.recipe.presets import load_model
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import train_config_for_algo
from jaxrl_sys.train.step.optim import make_optimizer
from jaxrl_sys.train.step.state import abstract_state, init_train_state
from jaxrl_sys.train.step.logprobs import token_logprobs
from jaxrl_sys.train.step.update import make_train_fns
from tests.train.step.test_step import ROWS, SEQ, _samples

LORA = LoraConfig(rank=4, alpha=8.0, targets="attention,mlp")


def _digest(tree) -> str:
  """sha256 over every leaf's bytes (host side: independent of `lora.base_digest`)."""
  h = hashlib.sha256()
  for x in jax.tree.leaves(tree):
    h.update(np.ascontiguousarray(np.asarray(x)).tobytes())
  return h.hexdigest()


def _setup(model, kl_coef=None):
  mc = dataclasses.replace(load_model(model, max_seq_len=SEQ).config, lora=LORA)
  tc = train_config_for_algo("grpo", kl_coef=kl_coef)
  opt = make_optimizer(tc.optim)
  mesh = make_mesh("1x1")
  fns = make_train_fns(mc, tc, opt, abstract_state(mc, tc, opt), mesh)
  return mc, tc, opt, mesh, fns


def test_step_changes_only_the_adapters():
  mc, tc, opt, mesh, fns = _setup("tiny")
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)
  base_before = _digest(state.base)
  base_arrays = jax.tree.leaves(state.base)
  adapters_before = jax.tree.map(np.asarray, state.params)
  mb = fns.put_batch(batch_lib.pack(_samples(40), ROWS, SEQ))
  for _ in range(2):
    state, metrics = fns.fused_step(state, mb)
  # The base: the same arrays (never donated, never copied), the same bytes.
  assert all(a is b for a, b in zip(jax.tree.leaves(state.base), base_arrays))
  assert _digest(state.base) == base_before
  # Every adapter leaf is trained (B moved off zero, so A gets gradient from the 2nd step).
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), adapters_before,
                       state.params)
  assert all(jax.tree.leaves(moved)), moved
  assert float(metrics["grad_norm"]) > 0
  # Gradients and moments cover the adapters only: Adam's mu and nu are adapter-shaped.
  adapter_bytes = lora_lib.nbytes(state.params)
  moment_bytes = sum(x.nbytes for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)
  assert moment_bytes == 2 * adapter_bytes
  assert state.ref_params is None
  assert adapter_bytes < 0.25 * lora_lib.nbytes(state.base)


def test_adapter_gradient_equals_the_merged_weights_gradient():
  """d loss / d (A, B) through `x @ W + s (x A) B` equals the chain rule through the merged
  weight W + s A B (jnp merge, float32): an independent path through the plain model."""
  mc, tc, opt, mesh, fns = _setup("tiny_moe")
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=1)
  key = jax.random.key(3)
  ad = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(key, x.shape), state.params)
  mb = fns.put_batch(batch_lib.pack(_samples(16), ROWS, SEQ))
  dense = dataclasses.replace(mc, moe=dataclasses.replace(mc.moe, implementation="dense"))
  base_mc = lora_lib.without_lora(dense)
  s = LORA.scale

  def merged(ad):
    out = jax.tree.map(lambda x: x, state.base)
    for path in lora_lib.target_paths(mc):
      _, contract, lead = lora_lib.WEIGHTS[path]
      node = out["layers"]
      for k in path[:-1]:
        node = node[k]
      w, a, b = node[path[-1]], lora_lib.get_path(ad["layers"], path)["a"], lora_lib.get_path(
          ad["layers"], path)["b"]
      lhs = a.reshape(*w.shape[:lead], -1, a.shape[-1])
      rhs = b.reshape(*w.shape[:lead], b.shape[lead], -1)
      node[path[-1]] = w + s * jnp.matmul(lhs, rhs).reshape(w.shape)
    return out

  def loss_ours(ad):
    lp, _, _ = token_logprobs(state.base, mc, tc, mb, state.moe_state, lora=ad)
    return jnp.sum(lp * mb.loss_mask)

  def loss_ref(ad):
    lp, _, _ = token_logprobs(merged(ad), base_mc, tc, mb, state.moe_state)
    return jnp.sum(lp * mb.loss_mask)

  g1 = jax.jit(jax.grad(loss_ours))(ad)
  g2 = jax.jit(jax.grad(loss_ref))(ad)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-3, atol=2e-5), g1, g2)

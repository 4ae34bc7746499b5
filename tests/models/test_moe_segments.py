"""The block-by-block expert-segment path (CPU default at training sizes) against the dense
all-experts einsum, in values and gradients, for balanced, skewed and padded routings and for
blocks smaller and larger than the segments."""
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_sys import models
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.models.moe import experts as moe_experts
from jaxrl_sys.models.moe import segments as moe_segments
from jaxrl_sys.sharding import make_mesh
from tests.precision_helpers import needs_devices, per_backend
from tests.models.test_moe_blocked import (_experts, _routing, assert_matches_dense,
                                           assert_model_matches_dense)


@pytest.mark.parametrize("n,e,k,block,skew,drop", [
    (24, 4, 2, None, 0.0, 0),    # balanced, default block
    (24, 4, 2, 8, 50.0, 0),      # every token on the same two experts: 3 blocks each, 2 empty
    (37, 4, 2, 8, 0.0, 3),       # ragged segments and inactive assignments
    (37, 4, 2, 64, 1.0, 0),      # one block longer than every segment
    (5, 8, 1, None, 0.0, 0),     # fewer tokens than experts
    (300, 8, 2, 16, 2.0, 5),     # many blocks and 4-row tail blocks, skewed, with padding
    (300, 8, 2, 30, 0.0, 0),     # a block that is no multiple of TAIL_SPLIT: 8-row tails
])
def test_segments_equal_dense_values_and_grads(n, e, k, block, skew, drop):
  experts, gates, active = _routing(n, e, k, seed=n, skew=skew, drop_every=drop)
  assert_matches_dense(
      lambda p, x, g: moe_segments.segment_experts(p, x, experts, g, active, block=block),
      e, n, experts, gates, active)


def test_block_rows_is_half_the_balanced_load():
  assert moe_segments.block_rows(5120, 8) == 320          # tail blocks of 80 rows
  assert moe_segments.block_rows(128, 8) == 32            # tail blocks of 8 rows
  assert moe_segments.block_rows(3, 8) == 32
  with pytest.raises(ValueError, match="block"):
    experts, gates, active = _routing(4, 4, 2, seed=0)
    moe_segments.segment_experts({"w_gate": jnp.zeros((4, 2, 2)), "w_up": jnp.zeros((4, 2, 2)),
                                  "w_down": jnp.zeros((4, 2, 2))}, jnp.zeros((4, 2)), experts,
                                 gates, active, block=-1)


def test_auto_picks_slots_for_decode_and_segments_for_training_sizes():
  # CPU: slots for 512 rows (decode), segments for a training micro-batch; GPU: ragged
  assert moe.resolve_implementation("auto", 64, 8) == per_backend(cpu="slots", gpu="ragged")
  assert moe.resolve_implementation("auto", 2560, 8) == per_backend(cpu="segments", gpu="ragged")
  assert moe.resolve_implementation("ragged", 2560, 8) == "ragged"


def test_auto_model_at_training_size_matches_dense():
  """A forward + gradient of a whole MoE model big enough for "auto" to run segments."""
  cfg = models.ModelConfig(vocab_size=48, hidden_size=16, num_layers=2, num_heads=2,
                           num_kv_heads=1, head_dim=8, intermediate_size=32, max_seq_len=160,
                           moe=models.MoEConfig(num_experts=8, num_experts_per_tok=2,
                                                expert_intermediate_size=8))
  toks = jax.random.randint(jax.random.PRNGKey(1), (4, 150), 1, 48)     # 600 x 8 rows > 4096
  assert moe.resolve_implementation("auto", toks.size, 8) == per_backend(cpu="segments",
                                                                           gpu="ragged")
  mask = jnp.ones(toks.shape, jnp.int32).at[1, 140:].set(0)           # some right padding
  assert_model_matches_dense(cfg, toks, mask)


def _grads(fn, p, x, gates, experts, active):
  return jax.jit(jax.grad(lambda p, x, g: jnp.sum(jnp.cos(fn(p, x, experts, g, active))),
                          argnums=(0, 1, 2)))(p, x, gates)


def _dense(p, x, experts, gates, active):
  return moe_experts.dense_experts(p, x, experts, jnp.where(active, gates, 0.0))


def _max_rel_err(got, ref):
  return max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)) / jnp.max(jnp.abs(b)))
             for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)))


def test_bfloat16_tokens_keep_dtypes_and_match_dense_rounding():
  """bf16 activations with f32 weights: cotangents come back in the inputs' dtypes, and the
  error against the float32 dense reference is no worse than the dense einsum's own in bf16."""
  n, e, k = 640, 8, 2
  experts, gates, active = _routing(n, e, k, seed=3, skew=1.0, drop_every=7)
  p = _experts(e)
  x = jax.random.normal(jax.random.PRNGKey(7), (n, 16))
  ref = _grads(_dense, p, x, gates, experts, active)
  got = _grads(moe_segments.segment_experts, p, x.astype(jnp.bfloat16), gates, experts, active)
  assert [a.dtype for a in jax.tree_util.tree_leaves(got)] == [jnp.float32] * 3 + [
      jnp.bfloat16, jnp.float32]
  dense_bf16 = _grads(_dense, p, x.astype(jnp.bfloat16), gates, experts, active)
  assert _max_rel_err(got, ref) <= 2 * _max_rel_err(dense_bf16, ref)


@needs_devices(8)
def test_tokens_sharded_over_a_data_mesh():
  n, e, k = 640, 8, 2
  experts, gates, active = _routing(n, e, k, seed=5, skew=2.0)
  p = _experts(e)
  x = jax.random.normal(jax.random.PRNGKey(7), (n, 16))
  mesh = make_mesh("8")
  xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
  with jax.set_mesh(mesh):
    got = _grads(moe_segments.segment_experts, p, xs, gates, experts, active)
  assert _max_rel_err(got, _grads(_dense, p, x, gates, experts, active)) < 1e-5

"""Mesh strings, device-count errors and logical-axis rules."""
import pytest

import jax
from jax.sharding import PartitionSpec as P

from jaxrl_sys import models, sharding


@pytest.mark.parametrize("bad", ["8x", "x4", "0x4", "8*4", "", "ax4", "8x-1"])
def test_bad_mesh_strings(bad):
  with pytest.raises(ValueError, match="bad mesh string"):
    sharding.parse_mesh(bad)


def test_parse_and_make():
  spec = sharding.parse_mesh("2x4")
  assert spec.shape == (2, 4) and spec.axis_names == ("data", "model")
  mesh = sharding.make_mesh(spec)
  assert dict(mesh.shape) == {"data": 2, "model": 4}


def test_too_many_devices_names_the_devices():
  with pytest.raises(ValueError, match=r"needs 32 devices but only 8 are present \(8 cpu\)"):
    sharding.make_mesh("8x4")


def test_rules_fsdp_tp_and_indivisible_dims():
  mesh = sharding.make_mesh("2x4")
  assert sharding.logical_to_spec(("embed", "mlp"), mesh, (64, 128)) == P("data", "model")
  # 2 kv heads cannot split 4 ways: replicated
  spec = sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), mesh, (64, 2, 8))
  assert spec == P("data", None, None)


def test_sharded_forward_equals_single_device():
  cfg = models.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, intermediate_size=64, max_seq_len=32)
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  toks = jax.random.randint(jax.random.PRNGKey(1), (4, 8), 0, 64)
  ref = models.forward(params, cfg, toks).hidden
  mesh = sharding.make_mesh("2x4")
  sp = sharding.shard_tree(params, models.param_axes(cfg), mesh)
  assert sp["layers"]["mlp"]["w_gate"].sharding.spec == P(None, "data", "model")
  out = jax.jit(lambda p, t: models.forward(p, cfg, t).hidden)(sp, toks)
  import numpy as np
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)

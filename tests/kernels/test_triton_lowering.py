"""Each Pallas kernel lowers to Triton for CUDA (cross-platform export; no GPU needed).

This checks the Pallas -> Triton IR step (power-of-two tiles, supported ops, masked loads);
PTX compilation and runtime numerics need a GPU.
"""
import jax
import jax.numpy as jnp
import pytest
from jax import export

from jaxrl_sys import kernels

S = jax.ShapeDtypeStruct


def triton_calls(f, *specs):
  """Number of Triton custom calls in `f` exported for CUDA (as seen by an abstract H100)."""
  # jax >= 0.11 asks the (abstract) device for its compute capability while lowering.
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=None,
                                       platform="gpu")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    exported = export.export(
        jax.jit(f), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(*specs)
  return exported.mlir_module().count("__gpu$xla.gpu.triton")


def value_and_grad_sum(f, argnums):
  loss = lambda *a: sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree.leaves(f(*a)))
  return jax.value_and_grad(loss, argnums=argnums)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_fused_logprobs(dtype):
  f = lambda h, w, y: value_and_grad_sum(lambda h, w: kernels.fused_logprobs(
      h, w, y, impl="pallas", interpret=False), (0, 1))(h, w)
  assert triton_calls(f, S((100, 72), dtype), S((72, 1000), dtype), S((100,), jnp.int32)) == 3


def test_flash_attention():
  f = lambda q, k, v, s: value_and_grad_sum(lambda q, k, v: kernels.flash_attention(
      q, k, v, segment_ids=s, impl="pallas", interpret=False), (0, 1, 2))(q, k, v)
  q, kv = S((2, 100, 6, 80), jnp.bfloat16), S((2, 100, 2, 80), jnp.bfloat16)
  assert triton_calls(f, q, kv, kv, S((2, 100), jnp.int32)) == 3


def test_decode_attention():
  f = lambda q, k, v, m, n: kernels.decode_attention(q, k, v, m, lengths=n, impl="pallas",
                                                     interpret=False)
  kv = S((2, 300, 4, 128), jnp.bfloat16)
  assert triton_calls(f, S((2, 28, 128), jnp.bfloat16), kv, kv, S((2, 300), bool),
                      S((2,), jnp.int32)) == 1


def test_grouped_matmul():
  f = lambda a, b, g: value_and_grad_sum(lambda a, b: kernels.grouped_matmul(
      a, b, g, impl="pallas", interpret=False), (0, 1))(a, b)
  assert triton_calls(f, S((300, 96), jnp.bfloat16), S((7, 96, 200), jnp.bfloat16),
                      S((7,), jnp.int32)) == 3

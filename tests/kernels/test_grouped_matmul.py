"""grouped_matmul: ragged_dot reference vs naive loop, Pallas (interpret) vs ragged_dot."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.kernels import grouped_matmul, grouped_matmul_reference
from tests.kernels.helpers import assert_close, jit

M, K, N = 53, 24, 40
# An empty group, and 8 trailing rows past the sum (must come out zero).
SIZES = jnp.array([10, 0, 17, 3, 15], jnp.int32)


def naive(lhs, rhs, sizes):
  lhs, rhs = np.asarray(lhs, np.float32), np.asarray(rhs, np.float32)
  out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
  start = 0
  for g, size in enumerate(np.asarray(sizes)):
    out[start:start + size] = lhs[start:start + size] @ rhs[g]
    start += size
  return out


def operands(keys, dtype=jnp.float32):
  lhs = jax.random.normal(keys[0], (M, K), dtype)
  rhs = jax.random.normal(keys[1], (SIZES.shape[0], K, N), dtype)
  return lhs, rhs


def test_reference_matches_naive(keys):
  lhs, rhs = operands(keys)
  assert_close(grouped_matmul_reference(lhs, rhs, SIZES), naive(lhs, rhs, SIZES), scale=10.0)


@functools.partial(jit, static_argnums=0)
def out_and_grads(f, lhs, rhs, sizes, dout):
  out, vjp = jax.vjp(lambda a, b: f(a, b, sizes), lhs, rhs)
  return out, vjp(dout)


def test_pallas_matches_xla_with_grads(keys):
  lhs, rhs = operands(keys)
  dout = jax.random.normal(keys[2], (M, N))
  pallas = functools.partial(grouped_matmul, impl="pallas", tiling=(16, 16, 32))
  got = out_and_grads(pallas, lhs, rhs, SIZES, dout)
  assert float(jnp.abs(got[0][int(SIZES.sum()):]).max()) == 0.0
  expected = out_and_grads(functools.partial(grouped_matmul, impl="xla"), lhs, rhs, SIZES, dout)
  assert_close(got, expected, scale=100.0)


def test_pallas_bf16_preferred_f32(keys):
  lhs, rhs = operands(keys, jnp.bfloat16)
  out = jit(functools.partial(grouped_matmul, impl="pallas", tiling=(16, 16, 16),
                                  preferred_element_type=jnp.float32))(lhs, rhs, SIZES)
  assert out.dtype == jnp.float32
  # bf16 products are exact in f32, so only the summation order differs.
  assert_close(out, naive(lhs.astype(jnp.float32), rhs.astype(jnp.float32), SIZES), scale=10.0)

"""grouped_matmul "xla_tiled" and "pallas" (interpret): values and both gradients vs float64
numpy, the tile layout, and compile-only temp memory of the XLA paths at a scaled MoE shape."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys.kernels import grouped_matmul
from jaxrl_sys.kernels import grouped_matmul_tiled as gmm_tiled
from tests.kernels.helpers import jit

M, K, N = 53, 24, 40
# An empty group, a group spanning several tiles, and 8 trailing rows past the sum.
SIZES = np.array([10, 0, 17, 3, 15], np.int32)


def np_reference(lhs, rhs, sizes, dout):
  """float64 (out, d_lhs, d_rhs) of sum(out * dout), one loop over groups."""
  lhs, rhs, dout = (np.asarray(a, np.float64) for a in (lhs, rhs, dout))
  out, d_lhs, d_rhs = np.zeros_like(dout), np.zeros_like(lhs), np.zeros_like(rhs)
  start = 0
  for g, size in enumerate(sizes):
    rows = slice(start, start + size)
    out[rows] = lhs[rows] @ rhs[g]
    d_lhs[rows] = dout[rows] @ rhs[g].T
    d_rhs[g] = lhs[rows].T @ dout[rows]
    start += size
  return out, d_lhs, d_rhs


@functools.partial(jit, static_argnums=0)
def out_and_grads(f, lhs, rhs, sizes, dout):
  out, vjp = jax.vjp(lambda a, b: f(a, b, sizes), lhs, rhs)
  return (out,) + vjp(dout.astype(out.dtype))


IMPLS = {"xla_tiled": dict(impl="xla_tiled", tile_rows=8),
         "xla_tiled_one_tile": dict(impl="xla_tiled", tile_rows=64),
         "pallas": dict(impl="pallas", tiling=(16, 16, 32))}


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_values_and_grads_match_float64(keys, name):
  lhs = jax.random.normal(keys[0], (M, K))
  rhs = jax.random.normal(keys[1], (len(SIZES), K, N))
  dout = jax.random.normal(keys[2], (M, N))
  got = out_and_grads(functools.partial(grouped_matmul, **IMPLS[name]), lhs, rhs,
                      jnp.asarray(SIZES), dout)
  for a, e in zip(got, np_reference(lhs, rhs, SIZES, dout)):
    np.testing.assert_allclose(np.asarray(a, np.float64), e, atol=1e-4 * np.abs(e).max(),
                               rtol=1e-4)
  assert float(jnp.abs(got[0][int(SIZES.sum()):]).max()) == 0.0


def test_tiled_bf16(keys):
  lhs = jax.random.normal(keys[0], (M, K), jnp.bfloat16)
  rhs = jax.random.normal(keys[1], (len(SIZES), K, N), jnp.bfloat16)
  dout = jax.random.normal(keys[2], (M, N), jnp.bfloat16)
  out, d_lhs, d_rhs = out_and_grads(
      functools.partial(grouped_matmul, impl="xla_tiled", tile_rows=16), lhs, rhs,
      jnp.asarray(SIZES), dout)
  assert (out.dtype, d_lhs.dtype, d_rhs.dtype) == (jnp.bfloat16,) * 3
  for a, e in zip((out, d_lhs, d_rhs), np_reference(lhs, rhs, SIZES, dout)):
    np.testing.assert_allclose(np.asarray(a, np.float64), e, atol=2e-2 * np.abs(e).max())


def test_layout_round_trips_rows():
  src, dest, tile_group, tiles = gmm_tiled.layout(jnp.asarray(SIZES), M, 8)
  src, dest, tile_group = np.asarray(src), np.asarray(dest), np.asarray(tile_group)
  assert tiles % gmm_tiled.TILES_PER_STEP == 0 and tiles >= -(-M // 8) + len(SIZES)
  used = int(SIZES.sum())
  np.testing.assert_array_equal(src[dest[:used]], np.arange(used))   # every row comes back
  assert (dest[used:] == tiles * 8).all()                             # trailing rows dropped
  owner = np.repeat(np.arange(len(SIZES)), SIZES)
  for r in range(used):                                                # each tile: one group
    assert tile_group[dest[r] // 8] == owner[r]
  assert (src < M).sum() == used


def _temp(impl, m, d, f, e, dtype=jnp.float32, **kw):
  lhs = jax.ShapeDtypeStruct((m, d), dtype)
  rhs = jax.ShapeDtypeStruct((e, d, f), dtype)
  sizes = jax.ShapeDtypeStruct((e,), jnp.int32)
  loss = lambda x, w, s: jnp.sum(grouped_matmul(x, w, s, impl=impl, **kw).astype(jnp.float32))
  fn = jax.grad(loss, (0, 1))
  return jax.jit(fn).lower(lhs, rhs, sizes).compile().memory_analysis().temp_size_in_bytes


def test_tiled_temp_memory_is_bounded_by_activations():
  """Compile only (float32: XLA:CPU would upcast bf16 operands to f32 copies first): fwd+bwd
  temp <= 2x the activations (lhs + out) plus the f32 weight gradient, never rows x experts
  (`jax.lax.ragged_dot` takes 1.8 GiB here and 112 GiB at m=262144, d=1024, f=384)."""
  m, d, f, e = 16384, 256, 96, 64
  act = m * (d + f) * 4
  temp = _temp("xla_tiled", m, d, f, e, tile_rows=64)
  assert temp <= 2 * act + e * d * f * 4, (temp, act)

"""Grouped (ragged) matmul for mixture-of-experts: Pallas gmm/tgmm kernels and XLA reference.

out[r] = lhs[r] @ rhs[g(r)], where rows of lhs are sorted by group and group g owns the
group_sizes[g] rows after those of groups < g. Rows past sum(group_sizes) give zeros (the
semantics of `jax.lax.ragged_dot`, which is the "xla" path). Implementations (`impl`; "auto"
asks `jaxrl_sys.backend`: Pallas on GPU, "xla" elsewhere):

* "pallas": gmm/tgmm kernels under a custom VJP: d_lhs = gmm(d_out, rhs^T) and
  d_rhs[g] = lhs[rows of g]^T @ d_out[rows of g] (tgmm); no intermediate beyond the operands.
* "xla": `jax.lax.ragged_dot` (XLA:CPU runs it per group; XLA:GPU densifies it: 44 GiB temp
  fwd+bwd at m=262144, d=1024, f=384, 64 groups).
* "xla_tiled": `grouped_matmul_tiled`, plain XLA with the same custom-VJP structure over
  group-padded row tiles: temp O(activations) on every backend (the memory-safe fallback).
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys import backend
from jaxrl_sys.kernels import dispatch
from jaxrl_sys.kernels import grouped_matmul_pallas as gmm_pallas
from jaxrl_sys.kernels import grouped_matmul_tiled as gmm_tiled


def grouped_matmul_reference(lhs, rhs, group_sizes, *, preferred_element_type=None):
  """XLA path: `jax.lax.ragged_dot` (differentiable by its own rules)."""
  return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32),
                            preferred_element_type=preferred_element_type)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _gmm(lhs, rhs, group_sizes, out_dtype, tiling, interpret):
  return gmm_pallas.gmm(lhs, rhs, group_sizes, out_dtype=out_dtype, tiling=tiling,
                        interpret=interpret)


def _gmm_fwd(lhs, rhs, group_sizes, out_dtype, tiling, interpret):
  return _gmm(lhs, rhs, group_sizes, out_dtype, tiling, interpret), (lhs, rhs, group_sizes)


def _gmm_bwd(out_dtype, tiling, interpret, res, dout):
  del out_dtype
  lhs, rhs, group_sizes = res
  d_lhs = gmm_pallas.gmm(dout, rhs, group_sizes, out_dtype=lhs.dtype, tiling=tiling,
                         interpret=interpret, transpose_rhs=True)
  d_rhs = gmm_pallas.tgmm(lhs, dout, group_sizes, out_dtype=rhs.dtype, tiling=tiling,
                          interpret=interpret)
  return d_lhs, d_rhs, None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, impl: str = "auto",
                   preferred_element_type=None, tiling: tuple[int, int, int] = (64, 64, 64),
                   interpret: bool | None = None, tile_rows: int = 256) -> jax.Array:
  """Per-group matmul of row-sorted tokens with per-group weights.

  Args:
    lhs: `[m, k]` (float32 or bfloat16), rows sorted by group.
    rhs: `[num_groups, k, n]`.
    group_sizes: `[num_groups]` int32, sum <= m.
    impl: "auto" (`jaxrl_sys.backend`: "pallas" on GPU, "xla" elsewhere), "pallas", "xla"
      (`jax.lax.ragged_dot`) or "xla_tiled" (memory-safe XLA, `grouped_matmul_tiled`).
    preferred_element_type: output dtype; default: promoted dtype of lhs and rhs. Accumulation
      is float32 in the Pallas path.
    tiling: Pallas (tm, tk, tn) tiles (powers of two >= 16; clipped to the problem size).
    interpret: Pallas interpret mode; default True on CPU.
    tile_rows: rows per tile of "xla_tiled" (each group padded to whole tiles).

  Returns:
    `[m, n]`; rows past sum(group_sizes) are zero.
  """
  chex.assert_rank([lhs, rhs, group_sizes], [2, 3, 1])
  chex.assert_axis_dimension(rhs, 1, lhs.shape[1])
  chex.assert_axis_dimension(group_sizes, 0, rhs.shape[0])
  chex.assert_type(group_sizes, int)
  which = backend.kernel_impl("grouped_matmul", impl)
  if which == "xla":
    return grouped_matmul_reference(lhs, rhs, group_sizes,
                                    preferred_element_type=preferred_element_type)
  out_dtype = jnp.dtype(preferred_element_type or jnp.promote_types(lhs.dtype, rhs.dtype))
  if which == "xla_tiled":
    if tile_rows < 1:
      raise ValueError(f"tile_rows must be >= 1, got {tile_rows}")
    return gmm_tiled.tiled_gmm(lhs, rhs, group_sizes.astype(jnp.int32), out_dtype, int(tile_rows))
  return _gmm(lhs, rhs, group_sizes.astype(jnp.int32), out_dtype, gmm_pallas.Tiling(*tiling),
              dispatch.resolve_interpret(interpret))

"""Pallas kernels of `grouped_matmul`: gmm (forward and d_lhs) and tgmm (d_rhs).

Rows of lhs are sorted by group: group g owns rows [starts[g], ends[g]). Rows past the last
group's end produce zeros.

* gmm: grid (m tiles, n tiles). A row tile may straddle several groups; the program loops over
  exactly those groups (precomputed per tile from the group ends) and, for each, accumulates
  (lhs rows of that group) @ rhs[g], with the other rows masked to zero on load. With
  `transpose_rhs`, rhs is `[groups, n, k]` and the product is lhs @ rhs[g]^T (used for d_lhs).
* tgmm: grid (groups, k tiles, n tiles); out[g] = lhs[rows of g]^T @ dout[rows of g].
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxrl_sys.kernels import dispatch
from jaxrl_sys.kernels.dispatch import cdiv, load, store

f32 = jnp.float32


class Tiling(NamedTuple):
  """(tm, tk, tn) tiles, powers of two >= 16."""
  tm: int = 64
  tk: int = 64
  tn: int = 64


def _tiles(m, k, n, tiling: Tiling) -> Tiling:
  return Tiling(dispatch.block_size(tiling.tm, m), dispatch.block_size(tiling.tk, k),
                dispatch.block_size(tiling.tn, n))


def group_bounds(group_sizes, m: int, tm: int):
  """Group row ranges and, per m tile, the [first, last] group it may touch.

  Returns:
    (starts `[G]`, ends `[G]`, tile_lo `[m tiles]`, tile_hi `[m tiles]`), all int32.
  """
  ends = jnp.cumsum(group_sizes.astype(jnp.int32))
  starts = ends - group_sizes.astype(jnp.int32)
  first_row = jnp.arange(cdiv(m, tm), dtype=jnp.int32) * tm
  last_row = jnp.minimum(first_row + tm, m) - 1
  lo = jnp.searchsorted(ends, first_row, side="right").astype(jnp.int32)
  hi = jnp.searchsorted(ends, last_row, side="right").astype(jnp.int32)
  return starts, ends, lo, jnp.minimum(hi + 1, group_sizes.shape[0]).astype(jnp.int32)


def _gmm_kernel(lo_ref, hi_ref, start_ref, end_ref, lhs_ref, rhs_ref, out_ref, *, m, k, n,
                t: Tiling, transpose_rhs: bool, dtype):
  mi, ni = pl.program_id(0), pl.program_id(1)
  rows = mi * t.tm + jnp.arange(t.tm)
  cols = ni * t.tn + jnp.arange(t.tn)

  def group_body(g, acc):
    in_group = (rows >= start_ref[g]) & (rows < end_ref[g]) & (rows < m)

    def k_body(kk, acc):
      ks = kk * t.tk + jnp.arange(t.tk)
      x = load(lhs_ref.at[pl.ds(mi * t.tm, t.tm), pl.ds(kk * t.tk, t.tk)],
               mask=in_group[:, None] & (ks < k)[None, :], other=0.0).astype(dtype)
      if transpose_rhs:
        w = load(rhs_ref.at[g, pl.ds(ni * t.tn, t.tn), pl.ds(kk * t.tk, t.tk)],
                 mask=(cols < n)[:, None] & (ks < k)[None, :], other=0.0).astype(dtype)
        return acc + lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=f32)
      w = load(rhs_ref.at[g, pl.ds(kk * t.tk, t.tk), pl.ds(ni * t.tn, t.tn)],
               mask=(ks < k)[:, None] & (cols < n)[None, :], other=0.0).astype(dtype)
      return acc + jnp.dot(x, w, preferred_element_type=f32)

    return lax.fori_loop(0, cdiv(k, t.tk), k_body, acc)

  acc = lax.fori_loop(lo_ref[mi], hi_ref[mi], group_body, jnp.zeros((t.tm, t.tn), f32))
  store(out_ref, acc, mask=(rows < m)[:, None] & (cols < n)[None, :])


def gmm(lhs, rhs, group_sizes, *, out_dtype, tiling: Tiling, interpret: bool,
        transpose_rhs: bool = False):
  """`[m, n]` grouped product; rhs `[G, k, n]` (or `[G, n, k]` with transpose_rhs)."""
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  t = _tiles(m, k, n, tiling)
  mp, kp, np_ = cdiv(m, t.tm) * t.tm, cdiv(k, t.tk) * t.tk, cdiv(n, t.tn) * t.tn
  starts, ends, lo, hi = group_bounds(group_sizes, m, t.tm)
  nt = lo.shape[0]
  vec = lambda size: pl.BlockSpec((size,), lambda i, j: (0,))
  rhs_block = (num_groups, np_, kp) if transpose_rhs else (num_groups, kp, np_)
  kernel = lambda *refs: _gmm_kernel(*refs, m=m, k=k, n=n, t=t, transpose_rhs=transpose_rhs,
                                     dtype=jnp.promote_types(lhs.dtype, rhs.dtype))
  return pl.pallas_call(
      kernel,
      grid=(nt, cdiv(n, t.tn)),
      in_specs=[vec(nt), vec(nt), vec(num_groups), vec(num_groups),
                pl.BlockSpec((mp, kp), lambda i, j: (0, 0)),
                pl.BlockSpec(rhs_block, lambda i, j: (0, 0, 0))],
      out_specs=pl.BlockSpec((t.tm, t.tn), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      compiler_params=dispatch.compiler_params(num_warps=4, num_stages=2),
      interpret=interpret,
      name="gmm_t" if transpose_rhs else "gmm",
  )(lo, hi, starts, ends, lhs, rhs)


def _tgmm_kernel(start_ref, end_ref, lhs_ref, dout_ref, out_ref, *, m, k, n, t: Tiling, dtype):
  g, ki, ni = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  gs, ge = start_ref[g], jnp.minimum(end_ref[g], m)
  ks = ki * t.tk + jnp.arange(t.tk)
  cols = ni * t.tn + jnp.arange(t.tn)

  def body(mi, acc):
    rows = mi * t.tm + jnp.arange(t.tm)
    in_group = ((rows >= gs) & (rows < ge))[:, None]
    x = load(lhs_ref.at[pl.ds(mi * t.tm, t.tm), pl.ds(ki * t.tk, t.tk)],
             mask=in_group & (ks < k)[None, :], other=0.0).astype(dtype)
    dy = load(dout_ref.at[pl.ds(mi * t.tm, t.tm), pl.ds(ni * t.tn, t.tn)],
              mask=in_group & (cols < n)[None, :], other=0.0).astype(dtype)
    return acc + lax.dot_general(x, dy, (((0,), (0,)), ((), ())), preferred_element_type=f32)

  lower = lax.div(gs, t.tm)
  upper = jnp.maximum(lower, lax.div(ge + t.tm - 1, t.tm))
  acc = lax.fori_loop(lower, upper, body, jnp.zeros((t.tk, t.tn), f32))
  store(out_ref, acc, mask=(ks < k)[:, None] & (cols < n)[None, :])


def tgmm(lhs, dout, group_sizes, *, out_dtype, tiling: Tiling, interpret: bool):
  """`[G, k, n]` per-group lhs[rows of g]^T @ dout[rows of g] (zero for empty groups)."""
  m, k = lhs.shape
  n = dout.shape[1]
  num_groups = group_sizes.shape[0]
  t = _tiles(m, k, n, tiling)
  mp, kp, np_ = cdiv(m, t.tm) * t.tm, cdiv(k, t.tk) * t.tk, cdiv(n, t.tn) * t.tn
  starts, ends, _, _ = group_bounds(group_sizes, m, t.tm)
  vec = pl.BlockSpec((num_groups,), lambda g, i, j: (0,))
  kernel = lambda *refs: _tgmm_kernel(*refs, m=m, k=k, n=n, t=t,
                                      dtype=jnp.promote_types(lhs.dtype, dout.dtype))
  return pl.pallas_call(
      kernel,
      grid=(num_groups, cdiv(k, t.tk), cdiv(n, t.tn)),
      in_specs=[vec, vec, pl.BlockSpec((mp, kp), lambda g, i, j: (0, 0)),
                pl.BlockSpec((mp, np_), lambda g, i, j: (0, 0))],
      out_specs=pl.BlockSpec((None, t.tk, t.tn), lambda g, i, j: (g, i, j)),
      out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
      compiler_params=dispatch.compiler_params(num_warps=4, num_stages=2),
      interpret=interpret,
      name="tgmm",
  )(starts, ends, lhs, dout)

"""Pallas kernels of `flash_attention`: forward (with logsumexp), dq, and dk/dv.

Layout `[batch, seq, heads, head_dim]`. Grids:
* forward and dq: (query tiles, batch, q heads); loop over key tiles (bounded above when causal).
* dk/dv: (key tiles, batch, kv heads); loop over the q heads of the group and the query tiles
  (bounded below when causal), so GQA needs no atomics and no post-reduction.

Visibility: key j is visible to query i iff seg[i] == seg[j] != 0 (and j <= i when causal).
Positions past `seq` load segment id 0, so ragged tails are masked like padding. Rows with no
visible key get output 0 and logsumexp 0; the backward kernels use the logsumexp only under
the visibility mask, so such rows get zero probabilities and zero gradients.
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
_NEG = -1e30


class Config(NamedTuple):
  """Tiling (hashable: used as a custom_vjp nondiff argument)."""
  block_q: int = 64
  block_k: int = 64
  interpret: bool = False


class _Dims(NamedTuple):
  batch: int
  seq: int
  hq: int
  hkv: int
  d: int
  bq: int
  bk: int
  dp: int
  sp: int
  causal: bool
  scale: float

  @property
  def group(self):
    return self.hq // self.hkv


def dims(q, k, cfg: Config, causal: bool, scale: float) -> _Dims:
  batch, seq, hq, d = q.shape
  bq = dispatch.block_size(cfg.block_q, seq)
  bk = dispatch.block_size(cfg.block_k, seq)
  sp = cdiv(seq, max(bq, bk)) * max(bq, bk)
  return _Dims(batch, seq, hq, k.shape[2], d, bq, bk, dispatch.block_size(d, d), sp, causal,
               scale)


def _scores(q, k, qpos, kpos, qseg, kseg, dm: _Dims):
  """Scaled `[bq, bk]` f32 scores and the visibility mask of one tile."""
  s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=f32) * dm.scale
  mask = (qseg[:, None] == kseg[None, :]) & (kseg[None, :] != 0)
  if dm.causal:
    mask = mask & (qpos[:, None] >= kpos[None, :])
  return s, mask


def _load_rows(ref, start, size, dm: _Dims, head=None, limit=None):
  """Rows start..start+size of a `[rows, dp]` (or `[rows, heads, dp]`) ref; 0 past seq and d.

  `limit` (default seq) is the number of valid rows of `ref`: a ref that is a tile starting at
  row r0 of the sequence has limit seq - r0.
  """
  pos = start + jnp.arange(size)
  limit = dm.seq if limit is None else limit
  mask = (pos < limit)[:, None] & (jnp.arange(dm.dp) < dm.d)[None, :]
  idx = (pl.ds(start, size), slice(None)) if head is None else (pl.ds(start, size), head,
                                                                 slice(None))
  return load(ref.at[idx], mask=mask, other=0.0), pos


def _load_vec(ref, start, size, dm: _Dims, other, head=None, limit=None):
  """Entries start..start+size of a `[seq]` (or `[heads, seq]`) ref; `other` past the limit."""
  pos = start + jnp.arange(size)
  idx = pl.ds(start, size) if head is None else (head, pl.ds(start, size))
  return load(ref.at[idx], mask=pos < (dm.seq if limit is None else limit), other=other)


def _k_upper(qi, dm: _Dims):
  nk = cdiv(dm.seq, dm.bk)
  if not dm.causal:
    return nk
  return jnp.minimum(nk, lax.div((qi + 1) * dm.bq + dm.bk - 1, dm.bk))


def _fwd_kernel(seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, dm: _Dims):
  qi = pl.program_id(0)
  q, qpos = _load_rows(q_ref, 0, dm.bq, dm, limit=dm.seq - qi * dm.bq)
  qpos = qpos + qi * dm.bq
  qseg = _load_vec(seg_ref, qi * dm.bq, dm.bq, dm, 0)

  def body(kj, carry):
    acc, m, l = carry
    k, kpos = _load_rows(k_ref, kj * dm.bk, dm.bk, dm)
    v, _ = _load_rows(v_ref, kj * dm.bk, dm.bk, dm)
    kseg = _load_vec(seg_ref, kj * dm.bk, dm.bk, dm, 0)
    s, mask = _scores(q, k, qpos, kpos, qseg, kseg, dm)
    m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, _NEG), axis=1))
    corr = jnp.exp(m - m_new)
    p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
    l = l * corr + jnp.sum(p, axis=1)
    acc = acc * corr[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=f32)
    return acc, m_new, l

  init = (jnp.zeros((dm.bq, dm.dp), f32), jnp.full((dm.bq,), _NEG, f32), jnp.zeros((dm.bq,), f32))
  acc, m, l = lax.fori_loop(0, _k_upper(qi, dm), body, init)
  seen = l > 0
  out = acc / jnp.where(seen, l, 1.0)[:, None]
  row_ok = qpos < dm.seq
  store(o_ref, out, mask=row_ok[:, None] & (jnp.arange(dm.dp) < dm.d)[None, :])
  store(lse_ref, jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0), mask=row_ok)


def _dq_kernel(seg_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, dm: _Dims):
  qi = pl.program_id(0)
  limit = dm.seq - qi * dm.bq  # valid rows of this query tile
  q, qpos = _load_rows(q_ref, 0, dm.bq, dm, limit=limit)
  do, _ = _load_rows(do_ref, 0, dm.bq, dm, limit=limit)
  lse = _load_vec(lse_ref, 0, dm.bq, dm, 0.0, limit=limit)
  delta = _load_vec(delta_ref, 0, dm.bq, dm, 0.0, limit=limit)
  qpos = qpos + qi * dm.bq
  qseg = _load_vec(seg_ref, qi * dm.bq, dm.bq, dm, 0)

  def body(kj, dq):
    k, kpos = _load_rows(k_ref, kj * dm.bk, dm.bk, dm)
    v, _ = _load_rows(v_ref, kj * dm.bk, dm.bk, dm)
    kseg = _load_vec(seg_ref, kj * dm.bk, dm.bk, dm, 0)
    s, mask = _scores(q, k, qpos, kpos, qseg, kseg, dm)
    p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
    dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=f32)
    ds = p * (dp - delta[:, None])
    return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=f32)

  dq = lax.fori_loop(0, _k_upper(qi, dm), body, jnp.zeros((dm.bq, dm.dp), f32))
  mask = (qpos < dm.seq)[:, None] & (jnp.arange(dm.dp) < dm.d)[None, :]
  store(dq_ref, dq * dm.scale, mask=mask)


def _dkv_kernel(seg_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                dm: _Dims):
  kj, h = pl.program_id(0), pl.program_id(2)
  limit = dm.seq - kj * dm.bk  # valid rows of this key tile
  k, kpos = _load_rows(k_ref, 0, dm.bk, dm, limit=limit)
  v, _ = _load_rows(v_ref, 0, dm.bk, dm, limit=limit)
  kpos = kpos + kj * dm.bk
  kseg = _load_vec(seg_ref, kj * dm.bk, dm.bk, dm, 0)
  nq = cdiv(dm.seq, dm.bq)
  lower = lax.div(kj * dm.bk, dm.bq) if dm.causal else 0

  def head_body(g, carry):
    hh = h * dm.group + g

    def body(qi, carry):
      dk, dv = carry
      q, qpos = _load_rows(q_ref, qi * dm.bq, dm.bq, dm, head=hh)
      do, _ = _load_rows(do_ref, qi * dm.bq, dm.bq, dm, head=hh)
      lse = _load_vec(lse_ref, qi * dm.bq, dm.bq, dm, 0.0, head=hh)
      delta = _load_vec(delta_ref, qi * dm.bq, dm.bq, dm, 0.0, head=hh)
      qseg = _load_vec(seg_ref, qi * dm.bq, dm.bq, dm, 0)
      s, mask = _scores(q, k, qpos, kpos, qseg, kseg, dm)
      p = jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)
      dv = dv + lax.dot_general(p.astype(do.dtype), do, (((0,), (0,)), ((), ())),
                                preferred_element_type=f32)
      dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=f32)
      ds = p * (dp - delta[:, None])
      dk = dk + lax.dot_general(ds.astype(q.dtype), q, (((0,), (0,)), ((), ())),
                                preferred_element_type=f32)
      return dk, dv

    return lax.fori_loop(lower, nq, body, carry)

  zeros = jnp.zeros((dm.bk, dm.dp), f32)
  dk, dv = lax.fori_loop(0, dm.group, head_body, (zeros, zeros))
  mask = (kpos < dm.seq)[:, None] & (jnp.arange(dm.dp) < dm.d)[None, :]
  store(dk_ref, dk * dm.scale, mask=mask)
  store(dv_ref, dv, mask=mask)


def _tile_spec(dm: _Dims, rows: int):
  """`[rows, dp]` tile of a `[batch, seq, heads, d]` array; grid (tile, batch, head)."""
  return pl.BlockSpec((None, rows, None, dm.dp), lambda i, b, h: (b, i, h, 0))


def _whole_spec(dm: _Dims, kv_of_q_head: bool):
  """Whole `[sp, dp]` sequence of one (batch, head); head = q head // group when asked."""
  div = dm.group if kv_of_q_head else 1
  return pl.BlockSpec((None, dm.sp, None, dm.dp), lambda i, b, h: (b, 0, h // div, 0))


def _seg_spec(dm: _Dims):
  return pl.BlockSpec((None, dm.sp), lambda i, b, h: (b, 0))


def forward(q, k, v, seg, *, dm: _Dims, cfg: Config):
  """Returns (out `[batch, seq, hq, d]` in q.dtype, lse `[batch, hq, seq]` f32)."""
  grid = (cdiv(dm.seq, dm.bq), dm.batch, dm.hq)
  return pl.pallas_call(
      lambda *refs: _fwd_kernel(*refs, dm=dm),
      grid=grid,
      in_specs=[_seg_spec(dm), _tile_spec(dm, dm.bq), _whole_spec(dm, True),
                _whole_spec(dm, True)],
      out_specs=[_tile_spec(dm, dm.bq),
                 pl.BlockSpec((None, None, dm.bq), lambda i, b, h: (b, h, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((dm.batch, dm.hq, dm.seq), f32)],
      compiler_params=dispatch.compiler_params(num_warps=4, num_stages=2),
      interpret=cfg.interpret,
      name="flash_attention_fwd",
  )(seg, q, k, v)


def backward(q, k, v, seg, out, lse, dout, *, dm: _Dims, cfg: Config):
  """Returns (dq, dk, dv) in the dtypes of q, k, v."""
  delta = jnp.einsum("bshd,bshd->bhs", out.astype(f32), dout.astype(f32))
  params = dispatch.compiler_params(num_warps=4, num_stages=1)
  vec_tile = pl.BlockSpec((None, None, dm.bq), lambda i, b, h: (b, h, i))
  dq = pl.pallas_call(
      lambda *refs: _dq_kernel(*refs, dm=dm),
      grid=(cdiv(dm.seq, dm.bq), dm.batch, dm.hq),
      in_specs=[_seg_spec(dm), _tile_spec(dm, dm.bq), _whole_spec(dm, True),
                _whole_spec(dm, True), _tile_spec(dm, dm.bq), vec_tile, vec_tile],
      out_specs=_tile_spec(dm, dm.bq),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=params, interpret=cfg.interpret, name="flash_attention_dq",
  )(seg, q, k, v, dout, lse, delta)
  # dk/dv: grid over (key tiles, batch, kv heads); q-side operands hold all q heads.
  all_heads = pl.BlockSpec((None, dm.sp, dm.hq, dm.dp), lambda j, b, h: (b, 0, 0, 0))
  all_vecs = pl.BlockSpec((None, dm.hq, dm.sp), lambda j, b, h: (b, 0, 0))
  kv_tile = pl.BlockSpec((None, dm.bk, None, dm.dp), lambda j, b, h: (b, j, h, 0))
  dk, dv = pl.pallas_call(
      lambda *refs: _dkv_kernel(*refs, dm=dm),
      grid=(cdiv(dm.seq, dm.bk), dm.batch, dm.hkv),
      in_specs=[pl.BlockSpec((None, dm.sp), lambda j, b, h: (b, 0)), all_heads, kv_tile, kv_tile,
                all_heads, all_vecs, all_vecs],
      out_specs=[kv_tile, kv_tile],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=params, interpret=cfg.interpret, name="flash_attention_dkv",
  )(seg, q, k, v, dout, lse, delta)
  return dq, dk, dv

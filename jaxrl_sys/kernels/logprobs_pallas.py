"""Pallas kernels of `fused_logprobs`: forward statistics, d_hidden and d_unembed.

Written for Triton (GPU) and interpret mode: power-of-two tiles, masked loads for ragged token,
hidden and vocabulary tails. Each program owns one output tile, so no atomics are needed:

* forward: grid over token tiles; loops over vocab tiles (online logsumexp and entropy sums),
  each logits tile accumulated over hidden-dim tiles.
* d_hidden: grid over token tiles; per vocab tile recompute logits, form d_logits, and add
  d_logits @ W_tile^T into the program's own rows of d_hidden.
* d_unembed: grid over vocab tiles; per token tile recompute logits, form d_logits, and add
  H_tile^T @ d_logits into the program's own columns of d_unembed.
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


class Config(NamedTuple):
  """Pallas tiling (hashable, so it can be a custom_vjp nondiff argument)."""
  block_tokens: int = 64
  block_vocab: int = 128
  block_d: int = 64
  interpret: bool = False


class _Dims(NamedTuple):
  tokens: int
  d: int
  vocab: int
  bt: int
  bv: int
  bd: int


def _dims(hidden, unembed, cfg: Config) -> _Dims:
  tokens, d = hidden.shape
  vocab = unembed.shape[1]
  return _Dims(tokens, d, vocab, dispatch.block_size(cfg.block_tokens, tokens),
               dispatch.block_size(cfg.block_vocab, vocab), dispatch.block_size(cfg.block_d, d))


def _logits_tile(h_ref, w_ref, ti, vj, dm: _Dims, inv_t):
  """`[bt, bv]` float32 logits of token tile `ti` and vocab tile `vj` (zero where out of range)."""
  rows = ti * dm.bt + jnp.arange(dm.bt)
  cols = vj * dm.bv + jnp.arange(dm.bv)
  dtype = jnp.promote_types(h_ref.dtype, w_ref.dtype)

  def body(kk, acc):
    ks = kk * dm.bd + jnp.arange(dm.bd)
    h = load(h_ref.at[pl.ds(ti * dm.bt, dm.bt), pl.ds(kk * dm.bd, dm.bd)],
             mask=(rows < dm.tokens)[:, None] & (ks < dm.d)[None, :], other=0.0)
    w = load(w_ref.at[pl.ds(kk * dm.bd, dm.bd), pl.ds(vj * dm.bv, dm.bv)],
             mask=(ks < dm.d)[:, None] & (cols < dm.vocab)[None, :], other=0.0)
    return acc + jnp.dot(h.astype(dtype), w.astype(dtype), preferred_element_type=f32)

  acc = lax.fori_loop(0, cdiv(dm.d, dm.bd), body, jnp.zeros((dm.bt, dm.bv), f32))
  return acc * inv_t, rows, cols


def _dlogits(logits, cols, y, logz, mean, g_lp, g_ent, dm: _Dims, inv_t):
  """d(loss)/d(h @ W) for one tile, zero outside the vocabulary."""
  p = jnp.exp(logits - logz[:, None])
  onehot = (cols[None, :] == y[:, None]).astype(f32)
  dl = g_lp[:, None] * (onehot - p) - g_ent[:, None] * p * (logits - mean[:, None])
  return jnp.where((cols < dm.vocab)[None, :], dl * inv_t, 0.0)


def _fwd_kernel(h_ref, w_ref, y_ref, logp_ref, ent_ref, logz_ref, mean_ref, *, dm: _Dims, inv_t):
  ti = pl.program_id(0)
  rows = ti * dm.bt + jnp.arange(dm.bt)
  row_ok = rows < dm.tokens
  y = load(y_ref.at[pl.ds(ti * dm.bt, dm.bt)], mask=row_ok, other=0)

  def body(vj, carry):
    m, s, t, tl = carry
    logits, _, cols = _logits_tile(h_ref, w_ref, ti, vj, dm, inv_t)
    valid = (cols < dm.vocab)[None, :]
    m_new = jnp.maximum(m, jnp.max(jnp.where(valid, logits, -jnp.inf), axis=1))
    corr = jnp.exp(m - m_new)
    e = jnp.where(valid, jnp.exp(logits - m_new[:, None]), 0.0)
    s = s * corr + jnp.sum(e, axis=1)
    t = t * corr + jnp.sum(e * logits, axis=1)
    tl = tl + jnp.sum(jnp.where(cols[None, :] == y[:, None], logits, 0.0), axis=1)
    return m_new, s, t, tl

  zeros = jnp.zeros((dm.bt,), f32)
  m, s, t, tl = lax.fori_loop(0, cdiv(dm.vocab, dm.bv), body,
                              (jnp.full((dm.bt,), -jnp.inf, f32), zeros, zeros, zeros))
  logz = m + jnp.log(s)
  mean = t / s
  sl = pl.ds(ti * dm.bt, dm.bt)
  store(logp_ref.at[sl], tl - logz, mask=row_ok)
  store(ent_ref.at[sl], logz - mean, mask=row_ok)
  store(logz_ref.at[sl], logz, mask=row_ok)
  store(mean_ref.at[sl], mean, mask=row_ok)


def _row_stats(refs, ti, dm: _Dims):
  """Loads targets and the per-token residuals/cotangents of token tile `ti`."""
  y_ref, logz_ref, mean_ref, glp_ref, gent_ref = refs
  row_ok = ti * dm.bt + jnp.arange(dm.bt) < dm.tokens
  sl = pl.ds(ti * dm.bt, dm.bt)
  y = load(y_ref.at[sl], mask=row_ok, other=-1)
  return (y,) + tuple(load(r.at[sl], mask=row_ok, other=0.0)
                      for r in (logz_ref, mean_ref, glp_ref, gent_ref))


def _zero_tiles(tile, n: int, shape):
  """Zeroes the `n` output tiles `tile(k) -> (ref, mask)` of `shape` before accumulating."""
  def zero(kk, c):
    ref, mask = tile(kk)
    store(ref, jnp.zeros(shape, f32), mask=mask)
    return c

  lax.fori_loop(0, n, zero, 0)


def _dh_kernel(h_ref, w_ref, y_ref, logz_ref, mean_ref, glp_ref, gent_ref, dh_ref, *, dm: _Dims,
               inv_t):
  ti = pl.program_id(0)
  rows = ti * dm.bt + jnp.arange(dm.bt)
  row_ok = (rows < dm.tokens)[:, None]
  stats = _row_stats((y_ref, logz_ref, mean_ref, glp_ref, gent_ref), ti, dm)
  nd = cdiv(dm.d, dm.bd)

  def tile(kk):
    ks = kk * dm.bd + jnp.arange(dm.bd)
    return dh_ref.at[pl.ds(ti * dm.bt, dm.bt), pl.ds(kk * dm.bd, dm.bd)], row_ok & (ks < dm.d)

  _zero_tiles(tile, nd, (dm.bt, dm.bd))

  def vbody(vj, c):
    logits, _, cols = _logits_tile(h_ref, w_ref, ti, vj, dm, inv_t)
    dz = _dlogits(logits, cols, *stats, dm, inv_t)

    def dbody(kk, c2):
      ks = kk * dm.bd + jnp.arange(dm.bd)
      w = load(w_ref.at[pl.ds(kk * dm.bd, dm.bd), pl.ds(vj * dm.bv, dm.bv)],
               mask=(ks < dm.d)[:, None] & (cols < dm.vocab)[None, :], other=0.0)
      ref, mask = tile(kk)
      acc = load(ref, mask=mask, other=0.0)
      store(ref, acc + jnp.dot(dz, w.astype(f32).T, preferred_element_type=f32), mask=mask)
      return c2

    return lax.fori_loop(0, nd, dbody, c)

  lax.fori_loop(0, cdiv(dm.vocab, dm.bv), vbody, 0)


def _dw_kernel(h_ref, w_ref, y_ref, logz_ref, mean_ref, glp_ref, gent_ref, dw_ref, *, dm: _Dims,
               inv_t):
  vj = pl.program_id(0)
  cols = vj * dm.bv + jnp.arange(dm.bv)
  col_ok = (cols < dm.vocab)[None, :]
  nd = cdiv(dm.d, dm.bd)

  def tile(kk):
    ks = kk * dm.bd + jnp.arange(dm.bd)
    ref = dw_ref.at[pl.ds(kk * dm.bd, dm.bd), pl.ds(vj * dm.bv, dm.bv)]
    return ref, (ks < dm.d)[:, None] & col_ok

  _zero_tiles(tile, nd, (dm.bd, dm.bv))

  def tbody(ti, c):
    stats = _row_stats((y_ref, logz_ref, mean_ref, glp_ref, gent_ref), ti, dm)
    logits, rows, _ = _logits_tile(h_ref, w_ref, ti, vj, dm, inv_t)
    dz = _dlogits(logits, cols, *stats, dm, inv_t)
    dz = jnp.where((rows < dm.tokens)[:, None], dz, 0.0)

    def dbody(kk, c2):
      ks = kk * dm.bd + jnp.arange(dm.bd)
      h = load(h_ref.at[pl.ds(ti * dm.bt, dm.bt), pl.ds(kk * dm.bd, dm.bd)],
               mask=(rows < dm.tokens)[:, None] & (ks < dm.d)[None, :], other=0.0)
      ref, mask = tile(kk)
      acc = load(ref, mask=mask, other=0.0)
      store(ref, acc + jnp.dot(h.astype(f32).T, dz, preferred_element_type=f32), mask=mask)
      return c2

    return lax.fori_loop(0, nd, dbody, c)

  lax.fori_loop(0, cdiv(dm.tokens, dm.bt), tbody, 0)


def _padded(dm: _Dims):
  return cdiv(dm.tokens, dm.bt) * dm.bt, cdiv(dm.d, dm.bd) * dm.bd, cdiv(dm.vocab, dm.bv) * dm.bv


def forward(hidden, unembed, targets, *, temperature: float, cfg: Config):
  """Pallas forward. Returns (logprobs, entropy, logz, mean_logit), each `[tokens]` float32."""
  dm = _dims(hidden, unembed, cfg)
  tp, dp, vp = _padded(dm)
  vec = jax.ShapeDtypeStruct((dm.tokens,), f32)
  kernel = lambda *refs: _fwd_kernel(*refs, dm=dm, inv_t=1.0 / temperature)
  return pl.pallas_call(
      kernel,
      grid=(cdiv(dm.tokens, dm.bt),),
      in_specs=[dispatch.full_spec((tp, dp)), dispatch.full_spec((dp, vp)),
                dispatch.full_spec((tp,))],
      out_specs=[dispatch.full_spec((tp,))] * 4,
      out_shape=[vec] * 4,
      compiler_params=dispatch.compiler_params(num_warps=4, num_stages=2),
      interpret=cfg.interpret,
      name="fused_logprobs_fwd",
  )(hidden, unembed, targets)


def backward(hidden, unembed, targets, logz, mean, g_lp, g_ent, *, temperature: float,
             cfg: Config):
  """Pallas backward. Returns (d_hidden `[tokens, d]` f32, d_unembed `[d, vocab]` f32)."""
  dm = _dims(hidden, unembed, cfg)
  tp, dp, vp = _padded(dm)
  inv_t = 1.0 / temperature
  in_specs = [dispatch.full_spec((tp, dp)), dispatch.full_spec((dp, vp))] + [
      dispatch.full_spec((tp,))] * 5
  args = (hidden, unembed, targets, logz, mean, g_lp, g_ent)
  common = dict(in_specs=in_specs, interpret=cfg.interpret,
                compiler_params=dispatch.compiler_params(num_warps=4, num_stages=1))
  dh = pl.pallas_call(
      lambda *refs: _dh_kernel(*refs, dm=dm, inv_t=inv_t),
      grid=(cdiv(dm.tokens, dm.bt),),
      out_specs=dispatch.full_spec((tp, dp)),
      out_shape=jax.ShapeDtypeStruct((dm.tokens, dm.d), f32),
      name="fused_logprobs_dhidden", **common)(*args)
  dw = pl.pallas_call(
      lambda *refs: _dw_kernel(*refs, dm=dm, inv_t=inv_t),
      grid=(cdiv(dm.vocab, dm.bv),),
      out_specs=dispatch.full_spec((dp, vp)),
      out_shape=jax.ShapeDtypeStruct((dm.d, dm.vocab), f32),
      name="fused_logprobs_dunembed", **common)(*args)
  return dh, dw

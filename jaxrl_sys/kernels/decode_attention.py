"""Single-token decode attention over a KV cache: Pallas kernel and XLA reference (forward only).

Each sequence contributes one new query token per q head. Keys are valid where `kv_mask` is True
(holes allowed, e.g. left padding) and, when `lengths` is given, at positions < lengths[b]; the
kernel skips key blocks at or past the length. q head h reads kv head h // (hq // hkv).

Pallas grid: (batch, kv heads). Each program loads the whole q-head group as one tile (padded to
a power of two >= 16 rows for `tl.dot`) and streams the cache in key blocks with an online
softmax, so each cache block is read once per kv head.
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxrl_sys import backend
from jaxrl_sys.kernels import dispatch
from jaxrl_sys.kernels.dispatch import cdiv, load, store

f32 = jnp.float32
_NEG = -1e30


def decode_attention_reference(q, k_cache, v_cache, kv_mask, *, scale=None, lengths=None,
                               return_lse=False):
  """Plain-XLA masked softmax decode attention; same contract as `decode_attention`."""
  batch, hq, d = q.shape
  max_len, hkv = k_cache.shape[1], k_cache.shape[2]
  scale = d ** -0.5 if scale is None else scale
  valid = kv_mask.astype(bool)
  if lengths is not None:
    valid = valid & (jnp.arange(max_len)[None, :] < lengths[:, None])
  qg = q.reshape(batch, hkv, hq // hkv, d)
  s = jnp.einsum("bhgd,blhd->bhgl", qg, k_cache.astype(q.dtype), preferred_element_type=f32)
  mask = valid[:, None, None, :]
  s = jnp.where(mask, s * scale, _NEG)
  m = jnp.max(s, axis=-1, keepdims=True)
  p = jnp.where(mask, jnp.exp(s - m), 0.0)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  p = p / jnp.where(denom > 0, denom, 1.0)
  out = jnp.einsum("bhgl,blhd->bhgd", p, v_cache.astype(f32), preferred_element_type=f32)
  out = out.reshape(batch, hq, d).astype(q.dtype)
  if not return_lse:
    return out
  lse = jnp.where(denom > 0, m + jnp.log(jnp.where(denom > 0, denom, 1.0)), _NEG)
  return out, lse.reshape(batch, hq)


class _Dims(NamedTuple):
  hq: int
  group: int
  gp: int
  d: int
  dp: int
  max_len: int
  bk: int
  scale: float


def _kernel(len_ref, q_ref, k_ref, v_ref, m_ref, o_ref, lse_ref=None, *, dm: _Dims):
  b, h = pl.program_id(0), pl.program_id(1)
  gi = jnp.arange(dm.gp)
  dmask = (jnp.arange(dm.dp) < dm.d)[None, :]
  row_ok = (gi < dm.group)[:, None]
  q = load(q_ref.at[pl.ds(h * dm.group, dm.gp), :], mask=row_ok & dmask, other=0.0)
  length = jnp.minimum(len_ref[b], dm.max_len)
  dtype = jnp.promote_types(q_ref.dtype, k_ref.dtype)

  def body(kj, carry):
    acc, m, l = carry
    kpos = kj * dm.bk + jnp.arange(dm.bk)
    in_range = kpos < length
    kmask = in_range[:, None] & dmask
    k = load(k_ref.at[pl.ds(kj * dm.bk, dm.bk), :], mask=kmask, other=0.0)
    v = load(v_ref.at[pl.ds(kj * dm.bk, dm.bk), :], mask=kmask, other=0.0)
    valid = (load(m_ref.at[pl.ds(kj * dm.bk, dm.bk)], mask=in_range, other=0) != 0)[None, :]
    s = lax.dot_general(q.astype(dtype), k.astype(dtype), (((1,), (1,)), ((), ())),
                        preferred_element_type=f32) * dm.scale
    m_new = jnp.maximum(m, jnp.max(jnp.where(valid, s, _NEG), axis=1))
    corr = jnp.exp(m - m_new)
    p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
    l = l * corr + jnp.sum(p, axis=1)
    acc = acc * corr[:, None] + jnp.dot(p, v.astype(f32), preferred_element_type=f32)
    return acc, m_new, l

  init = (jnp.zeros((dm.gp, dm.dp), f32), jnp.full((dm.gp,), _NEG, f32), jnp.zeros((dm.gp,), f32))
  acc, m, l = lax.fori_loop(0, lax.div(length + dm.bk - 1, dm.bk), body, init)
  out = acc / jnp.where(l > 0, l, 1.0)[:, None]
  store(o_ref.at[pl.ds(h * dm.group, dm.gp), :], out, mask=row_ok & dmask)
  if lse_ref is not None:
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), _NEG)
    store(lse_ref.at[pl.ds(h * dm.group, dm.gp)], lse, mask=gi < dm.group)


def _decode_pallas(q, k_cache, v_cache, kv_mask, lengths, scale, block_k, interpret, return_lse):
  batch, hq, d = q.shape
  max_len, hkv = k_cache.shape[1], k_cache.shape[2]
  group = hq // hkv
  dm = _Dims(hq, group, dispatch.block_size(group, group), d, dispatch.block_size(d, d), max_len,
             dispatch.block_size(block_k, max_len), scale)
  lp = cdiv(max_len, dm.bk) * dm.bk
  hp = hq + dm.gp  # room for the last group's padded tile
  q_spec = pl.BlockSpec((None, hp, dm.dp), lambda b, h: (b, 0, 0))
  kv_spec = pl.BlockSpec((None, lp, None, dm.dp), lambda b, h: (b, 0, h, 0))
  out_specs, out_shape = q_spec, jax.ShapeDtypeStruct(q.shape, q.dtype)
  if return_lse:
    out_specs = (q_spec, pl.BlockSpec((None, hp), lambda b, h: (b, 0)))
    out_shape = (out_shape, jax.ShapeDtypeStruct((batch, hq), f32))
  return pl.pallas_call(
      lambda *refs: _kernel(*refs, dm=dm),
      grid=(batch, hkv),
      in_specs=[pl.BlockSpec((batch,), lambda b, h: (0,)), q_spec, kv_spec, kv_spec,
                pl.BlockSpec((None, lp), lambda b, h: (b, 0))],
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=dispatch.compiler_params(num_warps=4, num_stages=2),
      interpret=interpret,
      name="decode_attention",
  )(lengths, q, k_cache, v_cache, kv_mask)


def decode_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, kv_mask: jax.Array,
                     *, scale: float | None = None, impl: str = "auto", block_k: int = 128,
                     lengths: jax.Array | None = None, interpret: bool | None = None,
                     return_lse: bool = False):
  """Attention of one new query token per sequence over its KV cache (inference only).

  Args:
    q: `[batch, num_q_heads, head_dim]` (float32 or bfloat16).
    k_cache: `[batch, max_len, num_kv_heads, head_dim]`; num_q_heads % num_kv_heads == 0. May be
      a different float dtype than q (it is cast inside).
    v_cache: `[batch, max_len, num_kv_heads, head_dim]`.
    kv_mask: `[batch, max_len]` bool, True = valid key (holes allowed, e.g. left padding).
    scale: score scale; default head_dim ** -0.5 (a Python float).
    impl: "auto" (Pallas on GPU, XLA elsewhere), "pallas" or "xla".
    block_k: key block of the Pallas kernel (power of two, >= 16).
    lengths: optional `[batch]` int32; keys at positions >= lengths[b] are ignored and their
      blocks skipped.
    interpret: Pallas interpret mode; default True on CPU.
    return_lse: also return the float32 log-sum-exp of the scaled scores `[batch, num_q_heads]`
      (-1e30 for a row with no valid key), so a caller can fold in more keys afterwards.

  Returns:
    `[batch, num_q_heads, head_dim]` in q.dtype; 0 for a row with no valid key (and the lse when
    `return_lse`).
  """
  chex.assert_rank([q, k_cache, v_cache, kv_mask], [3, 4, 4, 2])
  chex.assert_equal_shape([k_cache, v_cache])
  chex.assert_shape(kv_mask, k_cache.shape[:2])
  chex.assert_axis_dimension(q, 0, k_cache.shape[0])
  chex.assert_axis_dimension(q, 2, k_cache.shape[3])
  if q.shape[1] % k_cache.shape[2]:
    raise ValueError(f"num_q_heads {q.shape[1]} must be a multiple of num_kv_heads "
                     f"{k_cache.shape[2]}")
  if lengths is not None:
    chex.assert_shape(lengths, q.shape[:1])
  scale = q.shape[2] ** -0.5 if scale is None else float(scale)
  if backend.kernel_impl("decode_attention", impl) == "xla":
    return decode_attention_reference(q, k_cache, v_cache, kv_mask, scale=scale, lengths=lengths,
                                      return_lse=return_lse)
  if lengths is None:
    lengths = jnp.full(q.shape[:1], k_cache.shape[1], jnp.int32)
  return _decode_pallas(q, k_cache, v_cache, kv_mask.astype(jnp.int32), lengths.astype(jnp.int32),
                        scale, block_k, dispatch.resolve_interpret(interpret), return_lse)

"""Causal / segment-masked multi-head attention with GQA: Pallas flash kernels and XLA reference.

Query i may attend key j iff segment_ids[i] == segment_ids[j] != 0 (and j <= i when causal);
segment id 0 marks padding (left, right, or between packed sequences). Rows with no visible
key (padding queries) output 0. q head h reads kv head h // (num_q_heads // num_kv_heads).

Implementations (`impl`; "auto" asks `jaxrl_sys.backend`): "pallas" (the flash kernels here),
"xla" (`attention_reference`), "cudnn" (`jax.nn.dot_product_attention`: cuDNN's fused attention
on GPU, the GPU choice for bf16/fp16; on other backends it runs that function's XLA
implementation, which is how the CPU tests check the wrapper).
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys import backend
from jaxrl_sys.kernels import dispatch
from jaxrl_sys.kernels import flash_attention_pallas as fa_pallas

f32 = jnp.float32


def attention_mask(segment_ids: jax.Array, causal: bool) -> jax.Array:
  """`[batch, seq, seq]` bool visibility (query, key) from `[batch, seq]` segment ids."""
  seq = segment_ids.shape[1]
  mask = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
  if causal:
    mask = mask & jnp.tril(jnp.ones((seq, seq), bool))[None]
  return mask


def attention_reference(q, k, v, *, segment_ids=None, causal=True, scale=None):
  """Plain-XLA masked softmax attention (materialises `[batch, heads, seq, seq]` scores).

  Same contract as `flash_attention`; differentiable by ordinary autodiff.
  """
  batch, seq, hq, d = q.shape
  hkv = k.shape[2]
  scale = d ** -0.5 if scale is None else scale
  if segment_ids is None:
    segment_ids = jnp.ones((batch, seq), jnp.int32)
  mask = attention_mask(segment_ids, causal)[:, None, None]  # [b, 1, 1, q, k]
  qg = q.reshape(batch, seq, hkv, hq // hkv, d)
  s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=f32) * scale
  s = jnp.where(mask, s, -1e30)
  p = jnp.where(mask, jnp.exp(s - jnp.max(s, axis=-1, keepdims=True)), 0.0)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  p = p / jnp.where(denom > 0, denom, 1.0)
  out = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(v.dtype), v, preferred_element_type=f32)
  return out.reshape(batch, seq, hq, d).astype(q.dtype)


def attention_dpa(q, k, v, *, segment_ids=None, causal=True, scale=None, implementation=None):
  """Same contract as `flash_attention`, through `jax.nn.dot_product_attention`.

  Without segment ids this is the plain causal call. With them, rows that hold one segment
  followed by right padding (the train batches' layout) go through cuDNN's own padding mask
  (`query_seq_lengths`, no bias tensor); any other layout (left padding, packed segments) runs
  the Pallas flash kernel on GPU (cuDNN would need a `[batch, 1, seq, seq]` bias and its
  gradient) and a visibility mask elsewhere. The choice is a `lax.cond` on the whole batch.
  Queries with no visible key (segment 0) output 0. `implementation`: "cudnn", "xla" or None
  (jax's choice); default "cudnn" on GPU, "xla" elsewhere. cuDNN takes bfloat16/float16 with
  a head size that is a multiple of 8 (ValueError otherwise), and masked training needs an
  even sequence length: an odd one is padded by one masked position here.
  """
  if implementation is None:  # the backend's choice: cuDNN on a GPU, XLA elsewhere
    implementation = backend.kernel_impl("flash_attention")
  if implementation == "cudnn" and backend.platform() == "gpu":
    if not backend.cudnn_attention_ok(q.dtype, q.shape[-1]):
      raise ValueError(
          f"cuDNN attention takes bfloat16/float16 with a head size that is a multiple of 8 "
          f"(at most {backend.CUDNN_MAX_HEAD_DIM}); got {q.dtype} with head size "
          f"{q.shape[-1]}. Use compute_dtype='bfloat16', or attention_impl 'auto' (which "
          "picks Pallas for these inputs) or 'xla'")
    if q.shape[1] % 2:
      seq = q.shape[1]
      ids = (jnp.ones(q.shape[:2], jnp.int32) if segment_ids is None
             else segment_ids.astype(jnp.int32))
      pad = lambda x: jnp.pad(x, [(0, 0), (0, 1)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
      out = attention_dpa(pad(q), pad(k), pad(v), segment_ids=pad(ids), causal=causal,
                          scale=scale, implementation=implementation)
      return out[:, :seq]
  if segment_ids is None:
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                        implementation=implementation)
  seg = segment_ids.astype(jnp.int32)
  lengths = jnp.sum(seg != 0, axis=1).astype(jnp.int32)
  prefix = jnp.arange(seg.shape[1])[None, :] < lengths[:, None]
  one_segment = jnp.all((seg != 0) == prefix) & jnp.all((seg == 0) | (seg == seg[:, :1]))
  one_segment = one_segment & jnp.all(lengths > 0)

  def padded(q, k, v):
    return jax.nn.dot_product_attention(
        q, k, v, scale=scale, is_causal=causal, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation=implementation)

  def general(q, k, v):
    if implementation == "cudnn":  # the kernel cuDNN falls back to (`backend.FALLBACK`)
      return flash_attention(q, k, v, segment_ids=seg, causal=causal, scale=scale,
                             impl=backend.FALLBACK[("flash_attention", "cudnn")])
    mask = attention_mask(seg, causal)[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale,
                                        implementation=implementation)

  out = jax.lax.cond(one_segment, padded, general, q, k, v)
  return jnp.where((seg != 0)[:, :, None, None], out, 0).astype(q.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, seg, dm, cfg):
  return fa_pallas.forward(q, k, v, seg, dm=dm, cfg=cfg)[0]


def _flash_fwd(q, k, v, seg, dm, cfg):
  out, lse = fa_pallas.forward(q, k, v, seg, dm=dm, cfg=cfg)
  return out, (q, k, v, seg, out, lse)


def _flash_bwd(dm, cfg, res, dout):
  q, k, v, seg, out, lse = res
  dq, dk, dv = fa_pallas.backward(q, k, v, seg, out, lse, dout, dm=dm, cfg=cfg)
  return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                    segment_ids: jax.Array | None = None, causal: bool = True,
                    scale: float | None = None, impl: str = "auto", block_q: int = 64,
                    block_k: int = 64, interpret: bool | None = None) -> jax.Array:
  """Multi-head attention with segment masking, causal masking and GQA.

  Args:
    q: `[batch, seq, num_q_heads, head_dim]` (float32 or bfloat16).
    k: `[batch, seq, num_kv_heads, head_dim]`, num_q_heads % num_kv_heads == 0.
    v: `[batch, seq, num_kv_heads, head_dim]`.
    segment_ids: `[batch, seq]` int32; 0 = padding. None: one segment, no padding.
    causal: restrict key j to j <= i.
    scale: score scale; default head_dim ** -0.5 (a Python float).
    impl: "auto" (`jaxrl_sys.backend`: cuDNN on GPU for bf16/fp16 with head_dim <= 128, else
      Pallas on GPU; XLA elsewhere), "pallas", "xla" or "cudnn" (`attention_dpa`).
    block_q: query tile of the Pallas kernels (power of two, >= 16).
    block_k: key tile of the Pallas kernels (power of two, >= 16).
    interpret: Pallas interpret mode; default True on CPU.

  Returns:
    `[batch, seq, num_q_heads, head_dim]` in q.dtype; 0 for queries with no visible key.
  """
  chex.assert_rank([q, k, v], 4)
  chex.assert_equal_shape([k, v])
  chex.assert_equal_shape_prefix([q, k], 2)
  chex.assert_axis_dimension(k, 3, q.shape[3])
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"num_q_heads {q.shape[2]} must be a multiple of num_kv_heads {k.shape[2]}")
  if segment_ids is not None:
    chex.assert_shape(segment_ids, q.shape[:2])
  scale = q.shape[3] ** -0.5 if scale is None else float(scale)
  which = backend.kernel_impl("flash_attention", impl, dtype=q.dtype, head_dim=q.shape[3])
  if which == "xla":
    return attention_reference(q, k, v, segment_ids=segment_ids, causal=causal, scale=scale)
  if which == "cudnn":
    return attention_dpa(q, k, v, segment_ids=segment_ids, causal=causal, scale=scale)
  cfg = fa_pallas.Config(block_q, block_k, dispatch.resolve_interpret(interpret))
  dm = fa_pallas.dims(q, k, cfg, causal, scale)
  if segment_ids is None:
    segment_ids = jnp.ones(q.shape[:2], jnp.int32)
  return _flash(q, k, v, segment_ids.astype(jnp.int32), dm, cfg)

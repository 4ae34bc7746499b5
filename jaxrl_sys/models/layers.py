"""Building blocks of the policy transformer as pure functions over parameter dicts."""
from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def rms_norm(x, weight, eps: float):
  """RMSNorm as in Llama/Qwen: normalise in float32, cast back, then scale. `x [..., d]`."""
  xf = x.astype(jnp.float32)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * xf.astype(x.dtype)


def swiglu_mlp(p, x):
  """SwiGLU MLP: `x [..., d]` with w_gate/w_up `[d, f]`, w_down `[f, d]`."""
  dt = x.dtype
  gate = jnp.einsum("...d,df->...f", x, p["w_gate"].astype(dt))
  up = jnp.einsum("...d,df->...f", x, p["w_up"].astype(dt))
  return jnp.einsum("...f,fd->...d", jax.nn.silu(gate) * up, p["w_down"].astype(dt))


def masked_attention(q, k, v, mask, scale: float):
  """Plain softmax attention with GQA and an explicit mask (the XLA reference path).

  Args:
    q: `[batch, q_len, num_q_heads, head_dim]`.
    k, v: `[batch, kv_len, num_kv_heads, head_dim]`.
    mask: `[batch, q_len, kv_len]` bool, True where the query may see the key.
    scale: multiplier of q.k.

  Returns:
    `[batch, q_len, num_q_heads, head_dim]` in q's dtype; rows with no visible key give 0.
  """
  b, t, hq, d = q.shape
  hkv = k.shape[2]
  g = hq // hkv
  qg = q.reshape(b, t, hkv, g, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
  m = mask[:, None, None, :, :]
  scores = jnp.where(m, scores, NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1)
  probs = jnp.where(m, probs, 0.0)
  out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v)
  return out.reshape(b, t, hq, d)


def segment_causal_mask(segment_ids, causal: bool = True):
  """`[batch, seq]` int segment ids (0 = padding) -> `[batch, seq, seq]` bool mask."""
  same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
  if causal:
    t = segment_ids.shape[1]
    same = same & (jnp.arange(t)[None, :, None] >= jnp.arange(t)[None, None, :])
  return same


def single_query_attention(q, k, v, kv_mask, scale: float):
  """Attention of one new token per row over a KV cache (the XLA decode path).

  Written as broadcast-multiply + reductions rather than a batched matmul of 1-row matrices,
  which XLA:CPU runs about 2x faster at decode shapes.

  Args:
    q: `[batch, num_q_heads, head_dim]`; k, v: `[batch, max_len, num_kv_heads, head_dim]`;
    kv_mask: `[batch, max_len]` bool.

  Returns:
    `[batch, num_q_heads, head_dim]`.
  """
  b, hq, d = q.shape
  hkv = k.shape[2]
  qg = q.reshape(b, hkv, hq // hkv, d).astype(jnp.float32)
  s = jnp.sum(qg[:, None] * k[:, :, :, None, :].astype(jnp.float32), axis=-1) * scale
  s = jnp.where(kv_mask[:, :, None, None], s, NEG_INF)          # [b, len, hkv, g]
  p = jnp.where(kv_mask[:, :, None, None], jax.nn.softmax(s, axis=1), 0.0)
  o = jnp.sum(p[..., None] * v[:, :, :, None, :].astype(jnp.float32), axis=1)
  return o.reshape(b, hq, d).astype(q.dtype)

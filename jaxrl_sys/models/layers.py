"""Building blocks of the policy transformer as pure functions over parameter dicts (the
LoRA-adapted matmul included: `Adapter`, `adapted_matmul`)."""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def rms_norm(x, weight, eps: float):
  """RMSNorm as in Llama/Qwen: normalise in float32, cast back, then scale. `x [..., d]`."""
  xf = x.astype(jnp.float32)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * xf.astype(x.dtype)


def token_matmul(x, w, contract: int = 1):
  """`x [..., *k]` times `w [*k, *n]` as one 2-D matmul `[tokens, K] @ [K, N]` -> `[..., *n]`.

  The last `contract` axes of x meet the first `contract` axes of w. Flattening the token axes
  (batch, seq) and the contracted axes first keeps every forward and backward product a plain
  2-D GEMM: with several token axes, XLA:CPU lowers the weight gradient (a contraction over
  batch and seq) through a transposing copy that costs more than the GEMM itself.
  """
  lead, k_shape = x.shape[:x.ndim - contract], x.shape[x.ndim - contract:]
  n_shape = w.shape[contract:]
  k = math.prod(k_shape)
  y = jnp.dot(x.reshape(-1, k), w.astype(x.dtype).reshape(k, -1))
  return y.reshape(*lead, *n_shape)


class Adapter(NamedTuple):
  """One targeted weight's adapter inside the forward (one layer's slice).

  a: `[*lead, *in, r]`; b: `[*lead, r, *out]` (lead: the expert axis for routed experts);
  scale: alpha / rank; key: dropout key of this weight in this layer (None: no dropout);
  rate: the dropout rate.
  """
  a: jax.Array
  b: jax.Array
  scale: float
  key: jax.Array | None = None
  rate: float = 0.0

  def drop(self, x: jax.Array) -> jax.Array:
    """Dropout on the adapter's input `x` (the base matmul sees `x` unchanged)."""
    if self.key is None or not self.rate:
      return x
    keep = jax.random.bernoulli(self.key, 1.0 - self.rate, x.shape)
    return jnp.where(keep, x / (1.0 - self.rate), 0).astype(x.dtype)

  def delta(self, x: jax.Array, contract: int = 1) -> jax.Array:
    """`scale * (drop(x) @ a) @ b` for a weight without a lead axis; `[..., *out]`."""
    h = token_matmul(self.drop(x), self.a, contract)
    return token_matmul(h * jnp.asarray(self.scale, h.dtype), self.b)


def adapted_matmul(x: jax.Array, w: jax.Array, adapter: Adapter | None,
                   contract: int = 1) -> jax.Array:
  """`x @ w` (`token_matmul`), plus the adapter's `scale * (x @ A) @ B` when there is one."""
  y = token_matmul(x, w, contract)
  return y if adapter is None else y + adapter.delta(x, contract)


@jax.custom_vjp
def swiglu(gate, up):
  """`silu(gate) * up` (same shapes), with a one-pass backward.

  Autodiff of the composite keeps sigmoid(gate) and silu(gate) as extra residuals and runs
  several elementwise passes; here the backward recomputes the sigmoid from `gate` and writes
  both cotangents in one fused pass: with s = sigmoid(gate),
  d gate = dh * up * s * (1 + gate * (1 - s)),  d up = dh * gate * s.
  """
  return jax.nn.silu(gate) * up


def _swiglu_fwd(gate, up):
  return swiglu(gate, up), (gate, up)


def swiglu_grads(gate, up, dh):
  """Cotangents `(d gate, d up)` of `swiglu(gate, up)` for the output cotangent `dh`."""
  s = jax.nn.sigmoid(gate)
  return dh * up * (s * (1 + gate * (1 - s))), dh * gate * s


def _swiglu_bwd(res, dh):
  return swiglu_grads(*res, dh)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def swiglu_mlp(p, x, adapters=None):
  """SwiGLU MLP: `x [..., d]` with w_gate/w_up `[d, f]`, w_down `[f, d]`; `adapters`: this
  layer's LoRA adapters (`models.lora.layer_adapters`; the `("mlp", name)` entries apply)."""
  if not adapters:
    gate = token_matmul(x, p["w_gate"])
    up = token_matmul(x, p["w_up"])
    return token_matmul(swiglu(gate, up), p["w_down"])
  ad = lambda name: adapters.get(("mlp", name))  # noqa: E731
  gate = adapted_matmul(x, p["w_gate"], ad("w_gate"))
  up = adapted_matmul(x, p["w_up"], ad("w_up"))
  return adapted_matmul(swiglu(gate, up), p["w_down"], ad("w_down"))


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


def single_query_attention(q, k, v, kv_mask, scale: float, *, return_lse: bool = False):
  """Attention of one new token per row over a KV cache (the XLA decode path).

  The scores are laid out `[batch, len, kv_heads, group]` (softmax over a non-minor axis), which
  XLA:CPU runs about 1.5x faster than `[..., len]`-minor scores at batch 64 in the KV-cache
  layout `[batch, len, kv_heads, head_dim]`.

  Args:
    q: `[batch, num_q_heads, head_dim]`; k, v: `[batch, max_len, num_kv_heads, head_dim]`;
    kv_mask: `[batch, max_len]` bool.
    scale: multiplier of q.k.
    return_lse: also return the float32 log-sum-exp of the scaled scores `[batch, num_q_heads]`
      (`NEG_INF` for a row with no valid key), for `merge_new_token`.

  Returns:
    `[batch, num_q_heads, head_dim]` (and the lse when asked).
  """
  b, hq, d = q.shape
  hkv = k.shape[2]
  qg = q.reshape(b, hkv, hq // hkv, d).astype(jnp.float32)
  s = jnp.einsum("bhgd,bshd->bshg", qg, k.astype(jnp.float32)) * scale
  valid = kv_mask[:, :, None, None]
  s = jnp.where(valid, s, NEG_INF)                               # [b, len, hkv, g]
  m = jnp.max(s, axis=1)
  e = jnp.where(valid, jnp.exp(s - m[:, None]), 0.0)
  l = jnp.sum(e, axis=1)
  o = jnp.einsum("bshg,bshd->bhgd", e, v.astype(jnp.float32))
  o = (o / jnp.where(l > 0, l, 1.0)[..., None]).reshape(b, hq, d).astype(q.dtype)
  if not return_lse:
    return o
  lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), NEG_INF)
  return o, lse.reshape(b, hq)


def merge_new_token(out, lse, q, k_new, v_new, new_valid, scale: float):
  """Adds the current token's own key/value to attention already taken over the cache.

  Decoding attends to the cache read-only and folds in the new token here, so the cache can be
  written once per step for all layers instead of being rewritten inside every layer.

  Args:
    out: `[batch, num_q_heads, head_dim]` attention over the cache; lse: `[batch, num_q_heads]`
      float32 log-sum-exp of its scores (`NEG_INF` when it saw no key).
    q: `[batch, num_q_heads, head_dim]`; k_new, v_new: `[batch, num_kv_heads, head_dim]`.
    new_valid: `[batch]` bool, whether the new token is a real token (may be attended).
    scale: multiplier of q.k.

  Returns:
    `[batch, num_q_heads, head_dim]` in q's dtype: softmax attention over cache + new token.
  """
  b, hq, d = q.shape
  g = hq // k_new.shape[1]
  kn = jnp.repeat(k_new.astype(jnp.float32), g, axis=1)
  vn = jnp.repeat(v_new.astype(jnp.float32), g, axis=1)
  s = jnp.sum(q.astype(jnp.float32) * kn, axis=-1) * scale         # [b, hq]
  s = jnp.where(new_valid[:, None], s, NEG_INF)
  m = jnp.maximum(lse, s)
  w_old = jnp.where(lse > NEG_INF / 2, jnp.exp(lse - m), 0.0)
  w_new = jnp.where(new_valid[:, None], jnp.exp(s - m), 0.0)
  denom = w_old + w_new
  o = out.astype(jnp.float32) * w_old[..., None] + vn * w_new[..., None]
  return (o / jnp.where(denom > 0, denom, 1.0)[..., None]).astype(q.dtype)

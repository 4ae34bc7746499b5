"""Token-chunked fused log-probs (`fused_logprobs(impl="xla_tokens")`): the GPU path.

The vocabulary-streaming paths (Pallas, `impl="xla"`) split the unembedding into narrow column
tiles; on a GPU that trades cuBLAS's full-width GEMMs for small ones (the Pallas kernel ran
fwd+bwd 5x slower than the naive full-logits path at T=8192, V=151936 on an H100). This path
splits the *tokens* instead: each chunk of `c` tokens takes full-vocabulary GEMMs,

  forward   logits_c = h_c @ W  [c, V] -> logsumexp, target logit, entropy (per token),
  backward  recompute logits_c, dl_c [c, V] from the cotangents, then
            d_h_c = dl_c @ W^T  [c, d]   and   d_W += h_c^T @ dl_c  [d, V],

so every product is one vendor GEMM, and peak memory is O(c x V) (a few `[c, V]` float32
buffers plus the `[d, V]` float32 d_W accumulator) instead of the naive O(T x V). The GEMM inputs
keep their dtype (bf16 on GPU), accumulating in float32; `dl` is cast to the inputs' promoted
dtype for the two backward GEMMs, as autodiff of the naive bf16 path does.

With p = softmax(l), E[l] = sum_v p_v l_v and g_lp / g_ent the cotangents of logprob / entropy:
  d l_v = g_lp * (1[v == y] - p_v) - g_ent * p_v * (l_v - E[l]).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

f32 = jnp.float32

# Auto chunk: the largest power of two (between MIN and MAX tokens) whose `[c, V]` float32
# logits fit in this many elements (2^26 = 256 MiB; at V=151936 that is 256 tokens).
CHUNK_ELEMENTS = 1 << 26
MIN_CHUNK, MAX_CHUNK = 16, 4096


def auto_token_chunk(tokens: int, vocab: int) -> int:
  """Tokens per chunk: `[c, vocab]` float32 within `CHUNK_ELEMENTS`, at most `tokens` rounded
  up to a power of two."""
  fit = 1 << max(0, (CHUNK_ELEMENTS // max(vocab, 1)).bit_length() - 1)
  c = max(MIN_CHUNK, min(MAX_CHUNK, fit))
  return min(c, 1 << max(0, tokens - 1).bit_length())


def _chunks(x, c: int, fill=0):
  """`[T, ...]` -> `[n, c, ...]`, padded with `fill` to a multiple of c."""
  t = x.shape[0]
  n = -(-t // c)
  pad = [(0, n * c - t)] + [(0, 0)] * (x.ndim - 1)
  return jnp.pad(x, pad, constant_values=fill).reshape((n, c) + x.shape[1:])


def _logits(h, w, inv_t):
  return jnp.dot(h, w, preferred_element_type=f32) * inv_t


def forward(hidden, unembed, targets, *, temperature: float, token_chunk: int):
  """Forward statistics, chunk by chunk over tokens.

  Args:
    hidden: `[T, d]`; unembed: `[d, V]`; targets: `[T]` int32 (out of range: target logit 0).
    temperature: logits are divided by it.
    token_chunk: tokens per chunk (0: `auto_token_chunk`).

  Returns:
    (logprobs, entropy, logz, mean_logit), each `[T]` float32.
  """
  t, vocab = hidden.shape[0], unembed.shape[1]
  c = token_chunk or auto_token_chunk(t, vocab)
  inv_t = 1.0 / temperature

  def one(args):
    h, y = args
    logits = _logits(h, unembed, inv_t)
    m = logits.max(axis=1)
    e = jnp.exp(logits - m[:, None])
    s = e.sum(axis=1)
    logz = m + jnp.log(s)
    mean = (e * logits).sum(axis=1) / s
    ok = (y >= 0) & (y < vocab)
    picked = jnp.take_along_axis(logits, jnp.clip(y, 0, vocab - 1)[:, None], axis=1)[:, 0]
    return jnp.where(ok, picked, 0.0) - logz, logz - mean, logz, mean

  outs = lax.map(one, (_chunks(hidden, c), _chunks(targets, c, fill=-1)))
  return tuple(o.reshape(-1)[:t] for o in outs)


def backward(hidden, unembed, targets, logz, mean, g_lp, g_ent, *, temperature: float,
             token_chunk: int):
  """Gradients, chunk by chunk over tokens (each chunk's logits recomputed).

  Returns:
    (d_hidden `[T, d]` float32, d_unembed `[d, V]` float32).
  """
  t, vocab = hidden.shape[0], unembed.shape[1]
  c = token_chunk or auto_token_chunk(t, vocab)
  inv_t = 1.0 / temperature
  dt = jnp.promote_types(hidden.dtype, unembed.dtype)

  def step(dw, xs):
    h, y, lz, mu, glp, gent = xs
    logits = _logits(h, unembed, inv_t)
    p = jnp.exp(logits - lz[:, None])
    onehot = y[:, None] == jnp.arange(vocab)[None, :]
    dl = (glp[:, None] * (onehot - p) - gent[:, None] * p * (logits - mu[:, None])) * inv_t
    dl = dl.astype(dt)
    dh = lax.dot_general(dl, unembed.astype(dt), (((1,), (1,)), ((), ())),
                         preferred_element_type=f32)
    dw = dw + lax.dot_general(h.astype(dt), dl, (((0,), (0,)), ((), ())),
                              preferred_element_type=f32)
    return dw, dh

  # Padding tokens have zero cotangents and zero hidden rows: they add nothing.
  xs = (_chunks(hidden, c), _chunks(targets, c, fill=-1), _chunks(logz, c), _chunks(mean, c),
        _chunks(g_lp, c), _chunks(g_ent, c))
  dw, dh = lax.scan(step, jnp.zeros(unembed.shape, f32), xs)
  return dh.reshape(-1, hidden.shape[1])[:t], dw


__all__ = ["auto_token_chunk", "backward", "forward"]

"""Fused log-probability + entropy over the vocabulary, without `[tokens, vocab]` logits.

For every token t with hidden state h_t and target y_t, with logits l = h_t @ W / temperature:

  logprob_t = l[y_t] - logsumexp(l),   entropy_t = logsumexp(l) - sum_v softmax(l)_v * l_v.

Three paths (`impl`; "auto" asks `jaxrl_sys.backend`): "pallas" and "xla" stream over
vocabulary chunks with an online logsumexp (running max m, sum of exp(l - m), and sum of
exp(l - m) * l for the entropy), so peak memory is O(tokens x chunk); "xla_tokens"
(`logprobs_tokens`, the GPU choice) walks token chunks with full-vocabulary GEMMs, peak memory
O(token_chunk x vocab). The custom VJP recomputes each chunk's logits in the backward pass; with
p = softmax(l),
g_lp / g_ent the cotangents of logprob / entropy and E[l] = sum_v p_v l_v:

  d l_v = g_lp * (1[v == y] - p_v) - g_ent * p_v * (l_v - E[l]).
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_sys import backend
from jaxrl_sys.kernels import dispatch, logprobs_pallas, logprobs_tokens

f32 = jnp.float32


def _chunk_stats(hidden, w, targets, start, carry, inv_t):
  """Folds one vocab chunk `w [d, c]` (columns start..start+c) into the online statistics."""
  m, s, t, tl = carry
  logits = jnp.dot(hidden, w, preferred_element_type=f32) * inv_t  # [tokens, c]
  c = w.shape[1]
  m_new = jnp.maximum(m, logits.max(axis=1))
  corr = jnp.exp(m - m_new)
  e = jnp.exp(logits - m_new[:, None])
  s = s * corr + e.sum(axis=1)
  t = t * corr + (e * logits).sum(axis=1)
  local = targets - start
  hit = (local >= 0) & (local < c)
  picked = jnp.take_along_axis(logits, jnp.clip(local, 0, c - 1)[:, None], axis=1)[:, 0]
  tl = tl + jnp.where(hit, picked, 0.0)
  return m_new, s, t, tl


def _for_each_chunk(vocab: int, chunk: int, unembed, fn, carry):
  """Runs `fn(w_chunk, start, carry)` over full chunks in a loop, then over the ragged tail."""
  n_full, tail = divmod(vocab, chunk)
  if n_full:
    def body(i, c):
      start = i * chunk
      return fn(lax.dynamic_slice_in_dim(unembed, start, chunk, axis=1), start, c)
    carry = lax.fori_loop(0, n_full, body, carry)
  if tail:
    carry = fn(unembed[:, n_full * chunk:], n_full * chunk, carry)
  return carry


def logprobs_xla_stats(hidden, unembed, targets, *, temperature: float, chunk_size: int):
  """Chunked forward statistics (plain XLA).

  Returns:
    (logprobs, entropy, logz, mean_logit), each `[tokens]` float32.
  """
  tokens, vocab = hidden.shape[0], unembed.shape[1]
  inv_t = 1.0 / temperature
  init = (jnp.full((tokens,), -jnp.inf, f32), jnp.zeros((tokens,), f32),
          jnp.zeros((tokens,), f32), jnp.zeros((tokens,), f32))
  fn = lambda w, start, c: _chunk_stats(hidden, w, targets, start, c, inv_t)
  m, s, t, tl = _for_each_chunk(vocab, min(chunk_size, vocab), unembed, fn, init)
  logz = m + jnp.log(s)
  mean = t / s
  return tl - logz, logz - mean, logz, mean


def logprobs_xla_grads(hidden, unembed, targets, logz, mean, g_lp, g_ent, *, temperature: float,
                       chunk_size: int, gemm_dtype=None):
  """Chunked backward (plain XLA): recomputes each chunk's logits. Each column chunk of
  d_unembed is computed once (a GEMM contracting all tokens); d_hidden accumulates.

  `gemm_dtype`: None runs the two gradient GEMMs in float32; a dtype (the inputs' own, bf16 on
  GPU) casts `dl` and the GEMM inputs to it, accumulating in float32, as autodiff of the naive
  path does (the token path's backward with `backward_vocab_chunk`).

  Returns:
    (d_hidden `[tokens, d]` float32, d_unembed `[d, vocab]` in unembed.dtype).
  """
  vocab = unembed.shape[1]
  inv_t = 1.0 / temperature
  chunk = min(chunk_size, vocab)
  gd = f32 if gemm_dtype is None else gemm_dtype
  hidden_g = hidden.astype(gd)

  def fn(w, start, carry):
    dh, dw = carry
    logits = jnp.dot(hidden, w, preferred_element_type=f32) * inv_t
    p = jnp.exp(logits - logz[:, None])
    onehot = (targets - start)[:, None] == jnp.arange(w.shape[1])[None, :]
    dl = g_lp[:, None] * (onehot - p) - g_ent[:, None] * p * (logits - mean[:, None])
    dz = (dl * inv_t).astype(gd)
    dh = dh + lax.dot_general(dz, w.astype(gd), (((1,), (1,)), ((), ())),
                              preferred_element_type=f32)
    dw_c = lax.dot_general(hidden_g, dz, (((0,), (0,)), ((), ())),
                           preferred_element_type=f32).astype(dw.dtype)
    return dh, lax.dynamic_update_slice_in_dim(dw, dw_c, start, axis=1)

  init = (jnp.zeros(hidden.shape, f32), jnp.zeros(unembed.shape, unembed.dtype))
  return _for_each_chunk(vocab, chunk, unembed, fn, init)


def logprobs_reference(hidden, unembed, targets, *, temperature: float = 1.0):
  """Unfused reference: full `[tokens, vocab]` logits, log_softmax, gather, entropy."""
  logits = jnp.dot(hidden, unembed, preferred_element_type=f32) / temperature
  logp_all = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.take_along_axis(logp_all, targets[:, None], axis=-1)[:, 0]
  ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp, ent


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused(hidden, unembed, targets, temperature, chunk_size, plan):
  out, _ = _fused_fwd(hidden, unembed, targets, temperature, chunk_size, plan)
  return out


def _fused_fwd(hidden, unembed, targets, temperature, chunk_size, plan):
  """`plan`: a `logprobs_pallas.Config` (Pallas), ("tokens", token_chunk, backward_vocab_chunk),
  or None (XLA)."""
  if isinstance(plan, logprobs_pallas.Config):
    logp, ent, logz, mean = logprobs_pallas.forward(hidden, unembed, targets,
                                                    temperature=temperature, cfg=plan)
  elif plan is not None:
    logp, ent, logz, mean = logprobs_tokens.forward(hidden, unembed, targets,
                                                    temperature=temperature, token_chunk=plan[1])
  else:
    logp, ent, logz, mean = logprobs_xla_stats(hidden, unembed, targets, temperature=temperature,
                                               chunk_size=chunk_size)
  return (logp, ent), (hidden, unembed, targets, logz, mean)


def _fused_bwd(temperature, chunk_size, plan, res, cot):
  hidden, unembed, targets, logz, mean = res
  g_lp, g_ent = (c.astype(f32) for c in cot)
  if isinstance(plan, logprobs_pallas.Config):
    dh, dw = logprobs_pallas.backward(hidden, unembed, targets, logz, mean, g_lp, g_ent,
                                      temperature=temperature, cfg=plan)
  elif plan is not None and plan[2]:   # token-chunk forward, vocabulary-chunk backward
    dh, dw = logprobs_xla_grads(hidden, unembed, targets, logz, mean, g_lp, g_ent,
                                temperature=temperature, chunk_size=plan[2],
                                gemm_dtype=jnp.promote_types(hidden.dtype, unembed.dtype))
  elif plan is not None:
    dh, dw = logprobs_tokens.backward(hidden, unembed, targets, logz, mean, g_lp, g_ent,
                                      temperature=temperature, token_chunk=plan[1])
  else:
    dh, dw = logprobs_xla_grads(hidden, unembed, targets, logz, mean, g_lp, g_ent,
                                temperature=temperature, chunk_size=chunk_size)
  return dh.astype(hidden.dtype), dw.astype(unembed.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_logprobs(hidden: jax.Array, unembed: jax.Array, targets: jax.Array, *,
                   temperature: float = 1.0, chunk_size: int = 1024, impl: str = "auto",
                   interpret: bool | None = None, block_tokens: int = 64, block_vocab: int = 128,
                   block_d: int = 64, token_chunk: int = 0,
                   backward_vocab_chunk: int = 0) -> tuple[jax.Array, jax.Array]:
  """Log-probability of each target and entropy of softmax(hidden @ unembed / temperature).

  Never materialises `[tokens, vocab]` logits. Differentiable w.r.t. `hidden` and `unembed`
  (both outputs). Computation is float32 internally whatever the input dtype.

  Args:
    hidden: `[tokens, d]` float32 or bfloat16 final hidden states.
    unembed: `[d, vocab]` unembedding (output projection), float32 or bfloat16.
    targets: `[tokens]` int32 token ids in [0, vocab). An id outside that range (e.g. a -1
      padding id) gets a target logit of 0, so its logprob is -logsumexp: mask it in the loss.
    temperature: softmax temperature (a Python float; logits are divided by it).
    chunk_size: vocabulary chunk of the "xla" path (any value; the last chunk may be ragged).
    impl: "auto" (`jaxrl_sys.backend`: "xla_tokens" on GPU, "xla" elsewhere), "pallas", "xla"
      (vocabulary chunks) or "xla_tokens" (token chunks, full-vocabulary GEMMs).
    interpret: run the Pallas kernels in interpret mode; default: True on CPU.
    block_tokens: Pallas token tile (power of two).
    block_vocab: Pallas vocabulary tile (power of two).
    block_d: Pallas tile over the hidden dimension (power of two).
    token_chunk: tokens per chunk of the "xla_tokens" path (0: `[chunk, vocab]` float32 logits
      of at most 256 MiB, `logprobs_tokens.auto_token_chunk`).
    backward_vocab_chunk: "xla_tokens" only: 0 runs the backward over the same token chunks
      (a `[d, vocab]` float32 d_unembed accumulator read and written per chunk); > 0 runs it
      over vocabulary chunks of this many columns (`logprobs_xla_grads` with GEMMs in the
      inputs' dtype: each d_unembed column computed once, a `[tokens, d]` accumulator).

  Returns:
    (logprobs `[tokens]` float32, entropy `[tokens]` float32).
  """
  chex.assert_rank([hidden, unembed, targets], [2, 2, 1])
  chex.assert_equal_shape_prefix([hidden, targets], 1)
  chex.assert_axis_dimension(unembed, 0, hidden.shape[1])
  chex.assert_type(targets, int)
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
  temperature = float(temperature)
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  if token_chunk < 0:
    raise ValueError(f"token_chunk must be >= 0 (0 = auto), got {token_chunk}")
  if backward_vocab_chunk < 0:
    raise ValueError(f"backward_vocab_chunk must be >= 0 (0 = token chunks), got "
                     f"{backward_vocab_chunk}")
  plan = None
  which = backend.kernel_impl("fused_logprobs", impl)
  if which == "pallas":
    plan = logprobs_pallas.Config(block_tokens, block_vocab, block_d,
                                  dispatch.resolve_interpret(interpret))
  elif which == "xla_tokens":
    plan = ("tokens", int(token_chunk), int(backward_vocab_chunk))
  return _fused(hidden, unembed, targets.astype(jnp.int32), temperature, int(chunk_size), plan)

"""fused_logprobs(impl="xla_tokens"): values and gradients vs a float64 numpy reference, ragged
token chunks, the backward over (ragged) vocabulary chunks, out-of-range targets, and compiled
temp memory <= 1/8 of the naive path."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys.kernels import fused_logprobs, logprobs_tokens
from tests.kernels.helpers import jit

TEMP = 0.8


def np_reference(h, w, y, g_lp, g_ent, temperature=TEMP):
  """float64: (logprobs, entropy, d_hidden, d_unembed) of sum(g_lp * lp + g_ent * ent)."""
  h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
  g_lp, g_ent = np.asarray(g_lp, np.float64), np.asarray(g_ent, np.float64)
  y = np.asarray(y)
  logits = h @ w / temperature
  m = logits.max(1, keepdims=True)
  logz = m[:, 0] + np.log(np.exp(logits - m).sum(1))
  p = np.exp(logits - logz[:, None])
  mean = (p * logits).sum(1)
  ok = (y >= 0) & (y < w.shape[1])
  lp = np.where(ok, logits[np.arange(len(y)), np.clip(y, 0, w.shape[1] - 1)], 0.0) - logz
  ent = logz - mean
  onehot = (y[:, None] == np.arange(w.shape[1])[None, :]).astype(np.float64)
  dl = (g_lp[:, None] * (onehot - p) - g_ent[:, None] * p * (logits - mean[:, None])) / temperature
  return lp, ent, dl @ w.T, h.T @ dl


@functools.partial(jit, static_argnames=("token_chunk", "vocab_chunk"))
def value_and_grads(h, w, y, g_lp, g_ent, token_chunk, vocab_chunk=0):
  def loss(h, w):
    lp, ent = fused_logprobs(h, w, y, temperature=TEMP, impl="xla_tokens",
                             token_chunk=token_chunk, backward_vocab_chunk=vocab_chunk)
    return jnp.sum(lp * g_lp) + jnp.sum(ent * g_ent), (lp, ent)
  (_, (lp, ent)), (dh, dw) = jax.value_and_grad(loss, (0, 1), has_aux=True)(h, w)
  return lp, ent, dh, dw


@pytest.mark.parametrize("tokens,token_chunk,vocab_chunk",
                         [(37, 16, 0), (64, 64, 0), (50, 0, 0), (37, 16, 128)])
def test_values_and_grads_match_float64(keys, tokens, token_chunk, vocab_chunk):
  d, vocab = 24, 300
  h = jax.random.normal(keys[0], (tokens, d))
  w = jax.random.normal(keys[1], (d, vocab)) * 0.4
  y = jax.random.randint(keys[2], (tokens,), 0, vocab).at[3].set(-1).at[5].set(vocab)
  g_lp = jax.random.normal(keys[3], (tokens,))
  g_ent = jax.random.normal(keys[4], (tokens,))
  got = value_and_grads(h, w, y, g_lp, g_ent, token_chunk, vocab_chunk)   # 300 = 2 x 128 + 44
  want = np_reference(h, w, y, g_lp, g_ent)
  for a, e in zip(got, want):
    np.testing.assert_allclose(np.asarray(a, np.float64), e, atol=2e-5 * max(1, np.abs(e).max()),
                               rtol=1e-4)


@pytest.mark.parametrize("vocab_chunk", [0, 64, 512])   # 512: one chunk, no loop
def test_bf16_inputs_keep_dtypes_and_match(keys, vocab_chunk):
  tokens, d, vocab = 40, 32, 200
  h = jax.random.normal(keys[0], (tokens, d), jnp.bfloat16)
  w = (jax.random.normal(keys[1], (d, vocab)) * 0.3).astype(jnp.bfloat16)
  y = jax.random.randint(keys[2], (tokens,), 0, vocab)
  g = jnp.ones((tokens,))
  lp, ent, dh, dw = value_and_grads(h, w, y, g, g, 16, vocab_chunk)
  assert (lp.dtype, dh.dtype, dw.dtype) == (jnp.float32, jnp.bfloat16, jnp.bfloat16)
  want = np_reference(h.astype(jnp.float32), w.astype(jnp.float32), y, g, g)
  np.testing.assert_allclose(lp, want[0], atol=1e-4, rtol=1e-4)   # f32 accumulation
  np.testing.assert_allclose(ent, want[1], atol=1e-4, rtol=1e-4)
  # Gradients go through bf16 GEMM inputs (as autodiff of a bf16 model does): bf16 tolerance.
  for a, e in zip((dh, dw), want[2:]):
    np.testing.assert_allclose(np.asarray(a, np.float64), e, atol=3e-2 * np.abs(e).max())


def test_auto_token_chunk():
  assert logprobs_tokens.auto_token_chunk(8192, 151936) == 256    # 256 x V f32 <= 256 MiB
  assert logprobs_tokens.auto_token_chunk(8192, 1000) == 4096     # capped
  assert logprobs_tokens.auto_token_chunk(37, 1000) == 64         # no more than the tokens
  assert logprobs_tokens.auto_token_chunk(10, 10 ** 9) == 16      # floor


def test_rejects_negative_token_chunk(keys):
  h, w = jnp.ones((4, 8)), jnp.ones((8, 16))
  with pytest.raises(ValueError, match="token_chunk"):
    fused_logprobs(h, w, jnp.zeros((4,), jnp.int32), impl="xla_tokens", token_chunk=-1)
  with pytest.raises(ValueError, match="backward_vocab_chunk"):
    fused_logprobs(h, w, jnp.zeros((4,), jnp.int32), impl="xla_tokens", backward_vocab_chunk=-1)


def _temp_bytes(fn, *args):
  return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_memory_at_most_an_eighth_of_naive():
  """Compile only (abstract inputs): fwd+bwd temp of the chunked path vs full logits."""
  tokens, d, vocab = 4096, 64, 32768
  h = jax.ShapeDtypeStruct((tokens, d), jnp.float32)
  w = jax.ShapeDtypeStruct((d, vocab), jnp.float32)
  y = jax.ShapeDtypeStruct((tokens,), jnp.int32)

  def naive(h, w, y):
    logits = jnp.dot(h, w, preferred_element_type=jnp.float32) / TEMP
    logp = jax.nn.log_softmax(logits)
    lp = jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
    return lp, -(jnp.exp(logp) * logp).sum(-1)

  def grads(f):
    return jax.grad(lambda h, w, y: sum(jnp.sum(o) for o in f(h, w, y)), (0, 1))

  chunked = functools.partial(fused_logprobs, temperature=TEMP, impl="xla_tokens",
                              token_chunk=256)
  naive_temp = _temp_bytes(grads(naive), h, w, y)
  ours = _temp_bytes(grads(chunked), h, w, y)
  assert naive_temp >= 2 * tokens * vocab * 4      # at least two [T, V] float32 buffers
  assert ours * 8 <= naive_temp, (ours, naive_temp)
  by_vocab = functools.partial(chunked, backward_vocab_chunk=2048)   # [4096, 2048] per chunk
  ours = _temp_bytes(grads(by_vocab), h, w, y)
  assert ours * 8 <= naive_temp, (ours, naive_temp)

"""decode_attention: XLA reference vs naive, Pallas (interpret) vs XLA."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys.kernels import decode_attention, decode_attention_reference
from tests.kernels.helpers import assert_close, jit

B, L, D = 3, 45, 20


def naive(q, k, v, valid, scale):
  """Independent per-row numpy loop over batch and heads."""
  q, k, v, valid = (np.asarray(jnp.asarray(x, jnp.float32)) for x in (q, k, v, valid))
  out = np.zeros(q.shape, np.float32)
  group = q.shape[1] // k.shape[2]
  for b in range(q.shape[0]):
    idx = np.nonzero(valid[b])[0]
    for h in range(q.shape[1]):
      if idx.size:
        s = k[b, idx, h // group] @ q[b, h] * scale
        p = np.exp(s - s.max())
        out[b, h] = (p / p.sum()) @ v[b, idx, h // group]
  return out


def cache(keys, hq, hkv, dtype=jnp.float32):
  q = jax.random.normal(keys[0], (B, hq, D), dtype)
  k = jax.random.normal(keys[1], (B, L, hkv, D), dtype)
  v = jax.random.normal(keys[2], (B, L, hkv, D), dtype)
  pos = jnp.arange(L)
  # Left padding; holes; a row with no valid key at all.
  mask = jnp.stack([pos >= 7, (pos % 3) != 0, jnp.zeros(L, bool)])
  return q, k, v, mask


LENGTHS = jnp.array([30, 45, 10], jnp.int32)


@pytest.mark.parametrize("use_lengths", [False, True])
def test_reference_matches_naive(keys, use_lengths):
  q, k, v, mask = cache(keys, 6, 2)
  lengths = LENGTHS if use_lengths else None
  valid = mask & (jnp.arange(L)[None] < LENGTHS[:, None]) if use_lengths else mask
  out = jit(decode_attention_reference, static_argnames="scale")(q, k, v, mask, scale=0.4,
                                                                     lengths=lengths)
  assert_close(out, naive(q, k, v, valid, 0.4))


@pytest.mark.parametrize("hq,hkv,use_lengths", [(6, 2, True), (4, 4, False)])
def test_pallas_matches_xla(keys, hq, hkv, use_lengths):
  q, k, v, mask = cache(keys, hq, hkv)
  kw = dict(lengths=LENGTHS if use_lengths else None)
  f = jit(decode_attention, static_argnames=("impl", "block_k"))
  out = f(q, k, v, mask, impl="pallas", block_k=16, **kw)
  assert_close(out, f(q, k, v, mask, impl="xla", **kw))
  assert float(jnp.abs(out[2]).max()) == 0.0


def test_pallas_bf16_cache_under_jit(keys):
  q, k, v, mask = cache(keys, 6, 2, jnp.bfloat16)
  f = jit(lambda *a: decode_attention(*a, impl="pallas", block_k=32))
  out = f(q, k, v, mask)
  assert out.dtype == jnp.bfloat16
  assert_close(out, naive(q, k, v, mask, D ** -0.5), jnp.bfloat16)


def naive_lse(q, k, valid, scale):
  """log sum_j exp(q.k_j * scale) over valid keys, per row and head; -1e30 with no valid key."""
  q, k, valid = (np.asarray(jnp.asarray(x, jnp.float32)) for x in (q, k, valid))
  group = q.shape[1] // k.shape[2]
  out = np.full(q.shape[:2], -1e30, np.float32)
  for b in range(q.shape[0]):
    idx = np.nonzero(valid[b])[0]
    for h in range(q.shape[1]):
      if idx.size:
        s = k[b, idx, h // group] @ q[b, h] * scale
        out[b, h] = s.max() + np.log(np.exp(s - s.max()).sum())
  return out


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_return_lse_matches_naive(keys, impl):
  q, k, v, mask = cache(keys, 6, 2)
  f = jit(decode_attention, static_argnames=("impl", "block_k", "return_lse", "scale"))
  out, lse = f(q, k, v, mask, impl=impl, block_k=16, return_lse=True, scale=0.3)
  assert_close(out, naive(q, k, v, mask, 0.3))
  np.testing.assert_allclose(np.asarray(lse), naive_lse(q, k, mask, 0.3), rtol=1e-5, atol=1e-5)

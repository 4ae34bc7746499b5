"""flash_attention: XLA reference vs naive, Pallas (interpret) vs XLA (values and gradients)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys.kernels import attention_reference, flash_attention
from tests.kernels.helpers import assert_close, jit

SEQ = 37  # not a multiple of the 16-blocks: ragged tail


def naive(q, k, v, segment_ids, causal, scale):
  """Independent: repeat kv heads, explicit mask loops in numpy, softmax, zero empty rows."""
  group = q.shape[2] // k.shape[2]
  k, v = (jnp.repeat(x, group, axis=2).astype(jnp.float32) for x in (k, v))
  seg = np.asarray(segment_ids)
  b, s = seg.shape
  mask = np.zeros((b, s, s), bool)
  for bi in range(b):
    for i in range(s):
      for j in range(s):
        mask[bi, i, j] = seg[bi, i] == seg[bi, j] != 0 and (j <= i or not causal)
  return _masked_softmax_attention(q.astype(jnp.float32), k, v, mask, scale)


@functools.partial(jit, static_argnums=4)
def _masked_softmax_attention(q, k, v, mask, scale):
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
  probs = jax.nn.softmax(jnp.where(mask[:, None], scores, -jnp.inf), axis=-1)
  probs = jnp.nan_to_num(probs)  # rows with no visible key
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def segments():
  """Row 0: left padding then one sequence; row 1: two packed sequences then right padding."""
  left = np.r_[np.zeros(6), np.ones(SEQ - 6)]
  packed = np.r_[np.ones(11), 2 * np.ones(20), np.zeros(SEQ - 31)]
  return jnp.asarray(np.stack([left, packed]), jnp.int32)


def qkv(keys, hq, hkv, d=24, dtype=jnp.float32):
  q = jax.random.normal(keys[0], (2, SEQ, hq, d), dtype)
  k = jax.random.normal(keys[1], (2, SEQ, hkv, d), dtype)
  v = jax.random.normal(keys[2], (2, SEQ, hkv, d), dtype)
  return q, k, v


@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_naive(keys, causal):
  q, k, v = qkv(keys, 4, 2)
  ref = jit(functools.partial(attention_reference, causal=causal, scale=0.3))
  out = ref(q, k, v, segment_ids=segments())
  assert_close(out, naive(q, k, v, segments(), causal, 0.3))
  assert float(jnp.abs(out[0, :6]).max()) == 0.0  # padding queries output zeros


@functools.partial(jit, static_argnums=0)
def out_and_grads(f, q, k, v, dout):
  out, vjp = jax.vjp(f, q, k, v)
  return out, vjp(dout.astype(out.dtype))


@pytest.mark.parametrize("hq,hkv,causal,seg", [(4, 2, True, True), (3, 1, False, False)])
def test_pallas_matches_xla_with_grads(keys, hq, hkv, causal, seg):
  q, k, v = qkv(keys, hq, hkv)
  dout = jax.random.normal(keys[3], q.shape)
  kw = dict(segment_ids=segments() if seg else None, causal=causal)
  pallas = functools.partial(flash_attention, impl="pallas", block_q=16, block_k=16, **kw)
  xla = functools.partial(flash_attention, impl="xla", **kw)
  assert_close(out_and_grads(pallas, q, k, v, dout), out_and_grads(xla, q, k, v, dout),
               scale=10.0)


def test_pallas_bf16(keys):
  q, k, v = qkv(keys, 4, 2, dtype=jnp.bfloat16)
  f = jit(functools.partial(flash_attention, impl="pallas", block_q=16, block_k=32))
  out = f(q, k, v, segment_ids=segments())
  assert out.dtype == jnp.bfloat16
  assert_close(out, naive(q, k, v, segments(), True, 24 ** -0.5), jnp.bfloat16)

"""flash_attention(impl="cudnn") (`jax.nn.dot_product_attention`; its XLA implementation on CPU):
values vs the numpy-masked naive attention, gradients vs the XLA reference."""
import functools

import jax
import jax.numpy as jnp
import pytest

from jaxrl_sys.kernels import attention_dpa, flash_attention
from tests.kernels.helpers import assert_close, jit
from tests.kernels.test_flash_attention import naive, out_and_grads, qkv, segments


@pytest.mark.parametrize("hq,hkv,causal,seg", [(4, 2, True, True), (4, 4, False, True),
                                               (3, 1, True, False)])
def test_dpa_matches_naive_and_reference_grads(keys, hq, hkv, causal, seg):
  q, k, v = qkv(keys, hq, hkv, d=16)
  ids = segments() if seg else jnp.ones(q.shape[:2], jnp.int32)
  kw = dict(segment_ids=ids if seg else None, causal=causal, scale=0.3)
  dpa = functools.partial(flash_attention, impl="cudnn", **kw)
  out = jit(dpa)(q, k, v)
  assert_close(out, naive(q, k, v, ids, causal, 0.3))
  if seg:
    assert float(jnp.abs(out[0, :6]).max()) == 0.0   # padding queries output zeros
  dout = jax.random.normal(keys[3], q.shape)
  xla = functools.partial(flash_attention, impl="xla", **kw)
  assert_close(out_and_grads(dpa, q, k, v, dout), out_and_grads(xla, q, k, v, dout), scale=10.0)


def test_dpa_bf16_keeps_dtype(keys):
  q, k, v = qkv(keys, 4, 2, d=16, dtype=jnp.bfloat16)
  out = jit(functools.partial(attention_dpa, segment_ids=segments(), scale=0.25))(q, k, v)
  assert out.dtype == jnp.bfloat16
  assert_close(out, naive(q, k, v, segments(), True, 0.25), jnp.bfloat16)

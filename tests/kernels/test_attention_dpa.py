"""flash_attention(impl="cudnn") (`jax.nn.dot_product_attention`; its XLA implementation off GPU):
values vs the numpy-masked naive attention and gradients vs the XLA reference, for the three
layouts it routes differently: no segment ids, right-padded single segments (cuDNN's own
padding mask), and left padding / packed segments (the general branch)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys import backend
from jaxrl_sys.kernels import attention_dpa, flash_attention
from tests.kernels.helpers import assert_close, jit
from tests.kernels.test_flash_attention import SEQ, naive, out_and_grads, qkv, segments

# cuDNN takes half precision only: on a GPU the test runs in bf16 (with bf16 tolerances).
DTYPE = jnp.bfloat16 if backend.platform() == "gpu" else jnp.float32


def right_padded():
  return jnp.asarray(np.arange(SEQ)[None, :] < np.array([[30], [SEQ]]), jnp.int32)


LAYOUTS = {"none": lambda: None, "right_padded": right_padded, "mixed": segments}


@pytest.mark.parametrize("layout,hq,hkv,causal", [("mixed", 4, 2, True), ("mixed", 4, 4, False),
                                                  ("right_padded", 4, 2, True),
                                                  ("none", 3, 1, True)])
def test_dpa_matches_naive_and_reference_grads(keys, layout, hq, hkv, causal):
  q, k, v = qkv(keys, hq, hkv, d=16, dtype=DTYPE)
  seg = LAYOUTS[layout]()
  ids = jnp.ones(q.shape[:2], jnp.int32) if seg is None else seg
  kw = dict(segment_ids=seg, causal=causal, scale=0.3)
  dpa = functools.partial(flash_attention, impl="cudnn", **kw)
  out = jit(dpa)(q, k, v)
  assert out.dtype == DTYPE
  assert_close(out, naive(q, k, v, ids, causal, 0.3), DTYPE)
  pad = np.asarray(ids) == 0
  assert float(jnp.abs(out.astype(jnp.float32)[pad]).max(initial=0.0)) == 0.0
  dout = jax.random.normal(keys[3], q.shape)
  xla = functools.partial(flash_attention, impl="xla", **kw)
  assert_close(out_and_grads(dpa, q, k, v, dout), out_and_grads(xla, q, k, v, dout), DTYPE,
               scale=10.0)


def test_dpa_bf16_keeps_dtype(keys):
  q, k, v = qkv(keys, 4, 2, d=16, dtype=jnp.bfloat16)
  out = jit(functools.partial(attention_dpa, segment_ids=right_padded(), scale=0.25))(q, k, v)
  assert out.dtype == jnp.bfloat16
  assert_close(out, naive(q, k, v, right_padded(), True, 0.25), jnp.bfloat16)

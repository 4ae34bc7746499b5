"""The model's Pallas attention path (interpret mode on CPU) equals its XLA path."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys import models

BASE = dict(vocab_size=40, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
            intermediate_size=48, max_seq_len=32)


def test_pallas_attention_matches_xla_in_forward_and_decode():
  xla = models.ModelConfig(**BASE, attention_impl="xla")
  pal = models.ModelConfig(**BASE, attention_impl="pallas")
  params = models.init_params(xla, jax.random.PRNGKey(0))
  toks = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 1, 40)
  mask = jnp.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
  a = models.forward(params, xla, toks, attention_mask=mask).hidden
  b = models.forward(params, pal, toks, attention_mask=mask).hidden
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(a)[valid], np.asarray(b)[valid], atol=1e-5)
  s = models.SamplingConfig(temperature=0.0, max_new_tokens=4)
  ga = models.generate(params, xla, toks, mask, sampling=s)
  gb = models.generate(params, pal, toks, mask, sampling=s)
  np.testing.assert_array_equal(np.asarray(ga.tokens), np.asarray(gb.tokens))
  np.testing.assert_allclose(np.asarray(ga.logprobs), np.asarray(gb.logprobs), atol=1e-5)


def test_cudnn_attention_matches_xla_in_forward_and_decode():
  """attention_impl="cudnn" (dot_product_attention's XLA implementation on CPU) in training;
  decode, which has no cuDNN path, picks its own ("auto"). cuDNN takes half precision: on a
  GPU the models compute in bfloat16 and agree to bfloat16 rounding, and a float32 model that
  asks for cuDNN gets an error that says what to set."""
  gpu = jax.default_backend() == "gpu"
  dt = dict(compute_dtype="bfloat16") if gpu else {}
  xla = models.ModelConfig(**BASE, attention_impl="xla", **dt)
  dpa = models.ModelConfig(**BASE, attention_impl="cudnn", **dt)
  params = models.init_params(xla, jax.random.PRNGKey(0))
  toks = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 1, 40)
  mask = jnp.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
  a = models.forward(params, xla, toks, attention_mask=mask).hidden
  b = models.forward(params, dpa, toks, attention_mask=mask).hidden
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(a, np.float32)[valid], np.asarray(b, np.float32)[valid],
                             atol=5e-2 if gpu else 1e-5)
  s = models.SamplingConfig(temperature=0.0, max_new_tokens=4)   # as above: xla's compile hits
  ga = models.generate(params, xla, toks, mask, sampling=s)
  gb = models.generate(params, dpa, toks, mask, sampling=s)
  if gpu:   # bf16 prefills differ in rounding: greedy tokens may part after a near tie
    np.testing.assert_array_equal(np.asarray(ga.tokens)[:, 0], np.asarray(gb.tokens)[:, 0])
    f32 = models.ModelConfig(**BASE, attention_impl="cudnn")
    with pytest.raises(ValueError, match="cuDNN attention takes bfloat16/float16"):
      models.forward(params, f32, toks, attention_mask=mask)
  else:
    np.testing.assert_array_equal(np.asarray(ga.tokens), np.asarray(gb.tokens))

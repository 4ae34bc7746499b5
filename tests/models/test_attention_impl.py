"""The model's Pallas attention path (interpret mode on CPU) equals its XLA path."""
import numpy as np

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
  decode, which has no cuDNN path, picks its own ("auto")."""
  xla = models.ModelConfig(**BASE, attention_impl="xla")
  dpa = models.ModelConfig(**BASE, attention_impl="cudnn")
  params = models.init_params(xla, jax.random.PRNGKey(0))
  toks = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 1, 40)
  mask = jnp.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
  a = models.forward(params, xla, toks, attention_mask=mask).hidden
  b = models.forward(params, dpa, toks, attention_mask=mask).hidden
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(a)[valid], np.asarray(b)[valid], atol=1e-5)
  s = models.SamplingConfig(temperature=0.0, max_new_tokens=4)   # as above: xla's compile hits
  ga = models.generate(params, xla, toks, mask, sampling=s)
  gb = models.generate(params, dpa, toks, mask, sampling=s)
  np.testing.assert_array_equal(np.asarray(ga.tokens), np.asarray(gb.tokens))

"""Incremental decoding with the KV cache equals a full forward on the growing sequence."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys import models
from jaxrl_sys.models import kv_cache as kvc

CFG = models.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=8, intermediate_size=64, max_seq_len=64, qk_norm=True,
                         attention_bias=True)


def _full_logits(params, toks, mask):
  h = models.forward(params, CFG, toks, attention_mask=mask).hidden
  return models.logits_from_hidden(params, CFG, h)


@pytest.mark.parametrize("pad_side", ["left", "right"])
def test_decode_equals_full_forward(pad_side):
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  lengths = np.array([7, 3, 5])
  t, steps = 7, 6
  rng = np.random.default_rng(0)
  prompt = np.zeros((3, t), np.int32)
  mask = np.zeros((3, t), np.int32)
  for i, n in enumerate(lengths):
    sl = slice(t - n, t) if pad_side == "left" else slice(0, n)
    prompt[i, sl], mask[i, sl] = rng.integers(1, 64, n), 1
  new = rng.integers(1, 64, (3, steps)).astype(np.int32)
  cache = models.init_cache(CFG, 3, t + steps)
  out = models.forward(params, CFG, jnp.asarray(prompt), attention_mask=jnp.asarray(mask), cache=cache)
  cache = out.cache
  step = jax.jit(lambda p, tok, c: models.forward(p, CFG, tok, cache=c))
  for s in range(steps):
    o = step(params, jnp.asarray(new[:, s:s + 1]), cache)
    cache = o.cache
    got = models.logits_from_hidden(params, CFG, o.hidden[:, 0])
    # reference: the real tokens so far, left-aligned without padding, one row at a time
    for i, n in enumerate(lengths):
      real = np.concatenate([prompt[i][mask[i] == 1], new[i, :s + 1]])[None]
      ref = _full_logits(params, jnp.asarray(real), jnp.ones_like(real))[0, -1]
      np.testing.assert_allclose(np.asarray(got[i]), np.asarray(ref), atol=1e-5)
  assert np.array_equal(np.asarray(cache.next_position), lengths + steps)


def test_multi_token_chunk_after_prefill():
  """A resumed request: prefill the prompt, then append several tokens in one chunk."""
  params = models.init_params(CFG, jax.random.PRNGKey(1))
  toks = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 1, 64)
  full = _full_logits(params, toks, jnp.ones_like(toks))
  cache = models.init_cache(CFG, 2, 16)
  o1 = models.forward(params, CFG, toks[:, :5], cache=cache)
  o2 = models.forward(params, CFG, toks[:, 5:], cache=o1.cache)
  got = models.logits_from_hidden(params, CFG, o2.hidden)
  np.testing.assert_allclose(np.asarray(got), np.asarray(full[:, 5:]), atol=1e-5)


def test_select_and_update_rows_copy_a_prefix():
  params = models.init_params(CFG, jax.random.PRNGKey(1))
  toks = jax.random.randint(jax.random.PRNGKey(2), (1, 6), 1, 64)
  one = models.forward(params, CFG, toks, cache=models.init_cache(CFG, 1, 10)).cache
  big = kvc.update_rows(models.init_cache(CFG, 4, 10), jnp.array([1, 3]),
                        kvc.select_rows(one, jnp.array([0, 0])))
  assert np.array_equal(np.asarray(big.write_pos), [0, 6, 0, 6])
  np.testing.assert_array_equal(np.asarray(big.k[:, 3]), np.asarray(one.k[:, 0]))

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


_full_logits_jit = jax.jit(_full_logits)
# Jitted as a whole: op by op, every op of the forward (and every slice at a new Python index)
# would be compiled on its own.
_forward = jax.jit(models.forward, static_argnums=1, static_argnames="kv_window")
_logits = jax.jit(models.logits_from_hidden, static_argnums=1)


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
  out = _forward(params, CFG, jnp.asarray(prompt), attention_mask=jnp.asarray(mask),
                 cache=cache)
  cache = out.cache
  step = jax.jit(lambda p, tok, c: models.forward(p, CFG, tok, cache=c))
  for s in range(steps):
    o = step(params, jnp.asarray(new[:, s:s + 1]), cache)
    cache = o.cache
    got = np.asarray(_logits(params, CFG, o.hidden)[:, 0])
    # reference: the real tokens so far, left-aligned without padding, one row at a time
    for i, n in enumerate(lengths):
      real = np.concatenate([prompt[i][mask[i] == 1], new[i, :s + 1]])
      buf = np.zeros((1, t + steps), np.int32)  # one compiled shape; causal: the tail is inert
      buf[0, :len(real)] = real
      valid = (np.arange(t + steps) < len(real)).astype(np.int32)[None]
      ref = np.asarray(_full_logits_jit(params, jnp.asarray(buf), jnp.asarray(valid)))
      np.testing.assert_allclose(got[i], ref[0, len(real) - 1], atol=1e-5)
  assert np.array_equal(np.asarray(cache.next_position), lengths + steps)


def test_multi_token_chunk_after_prefill():
  """A resumed request: prefill the prompt, then append several tokens in one chunk."""
  params = models.init_params(CFG, jax.random.PRNGKey(1))
  toks = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 1, 64)
  full = _full_logits_jit(params, toks, jnp.ones_like(toks))
  cache = models.init_cache(CFG, 2, 16)
  o1 = _forward(params, CFG, toks[:, :5], cache=cache)
  o2 = _forward(params, CFG, toks[:, 5:], cache=o1.cache)
  got = _logits(params, CFG, o2.hidden)
  np.testing.assert_allclose(np.asarray(got), np.asarray(full[:, 5:]), atol=1e-5)


def test_select_and_update_rows_copy_a_prefix():
  params = models.init_params(CFG, jax.random.PRNGKey(1))
  toks = jax.random.randint(jax.random.PRNGKey(2), (1, 6), 1, 64)
  one = _forward(params, CFG, toks, cache=models.init_cache(CFG, 1, 10)).cache
  big = kvc.update_rows(models.init_cache(CFG, 4, 10), jnp.array([1, 3]),
                        kvc.select_rows(one, jnp.array([0, 0])))
  assert np.array_equal(np.asarray(big.write_pos), [0, 6, 0, 6])
  np.testing.assert_array_equal(np.asarray(big.k[:, 3]), np.asarray(one.k[:, 0]))


def test_decode_on_the_first_rows_of_a_larger_cache_with_a_window():
  """Decoding rows [0, 2) of a 4-row cache inside a 10-slot window: rows 0-1 get the logits of
  a full forward; a padded row writes nothing; rows 2-3 and slots past the window stay as they
  were."""
  params = models.init_params(CFG, jax.random.PRNGKey(3))
  toks = np.asarray(jax.random.randint(jax.random.PRNGKey(4), (4, 6), 1, 64), np.int32)
  cache = _forward(params, CFG, jnp.asarray(toks), cache=models.init_cache(CFG, 4, 16)).cache
  before = jax.tree_util.tree_map(np.asarray, cache)
  new = np.array([[9], [11]], np.int32)
  out = _forward(params, CFG, jnp.asarray(new), attention_mask=jnp.array([[1], [0]]),
                 cache=cache, kv_window=10)
  ref = np.asarray(_full_logits_jit(params, jnp.asarray(np.concatenate([toks[:1], new[:1]], 1)),
                                    jnp.ones((1, 7), jnp.int32)))[0, -1]
  got = np.asarray(_logits(params, CFG, out.hidden))[0, 0]
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)
  after = jax.tree_util.tree_map(np.asarray, out.cache)
  assert after.write_pos.tolist() == [7, 6, 6, 6]
  assert after.kv_valid[0, :7].all() and not after.kv_valid[1, 6]
  changed = np.any(after.k != before.k, axis=(0, 3, 4))          # [rows, slots]
  expected = np.zeros_like(changed)
  expected[0, 6] = True
  assert np.array_equal(changed, expected)
  np.testing.assert_array_equal(after.v[:, 1:], before.v[:, 1:])


def test_multi_token_chunk_needs_a_cache_of_the_same_rows():
  params = models.init_params(CFG, jax.random.PRNGKey(5))
  with pytest.raises(ValueError, match="cache holds 4 rows but tokens have 2"):
    models.forward(params, CFG, jnp.ones((2, 3), jnp.int32), cache=models.init_cache(CFG, 4, 8))

"""Sampling filters, determinism, stop tokens and per-request randomness."""
import numpy as np

import jax
import jax.numpy as jnp

from jaxrl_sys import models
from jaxrl_sys.models.sampling import SamplingConfig, filter_logits, first_argmax, sample_tokens

CFG = models.ModelConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                         head_dim=16, intermediate_size=64, max_seq_len=64)


def test_top_k_and_top_p_filters_against_numpy():
  logits = np.array([[2.0, 1.0, 0.5, 0.1, -1.0, 3.0]], np.float32)
  k = np.asarray(filter_logits(jnp.asarray(logits), 2, 1.0))
  assert set(np.flatnonzero(np.isfinite(k[0]))) == {0, 5}
  # nucleus: keep the smallest prefix (by prob) whose mass reaches p
  p = np.exp(logits[0] - logits[0].max())
  p /= p.sum()
  order = np.argsort(-p)
  cum = np.cumsum(p[order])
  keep = set(order[: int(np.searchsorted(cum, 0.8) + 1)])
  f = np.asarray(filter_logits(jnp.asarray(logits), 0, 0.8))
  assert set(np.flatnonzero(np.isfinite(f[0]))) == keep


def test_sampled_frequencies_follow_temperature_softmax():
  logits = jnp.array([[1.0, 0.0, -1.0, 0.5]] * 4000)
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  s = models.SamplingConfig(temperature=0.7)
  tok, lp = sample_tokens(logits, keys, jnp.zeros(4000, jnp.int32), s)
  p = np.exp(np.array([1.0, 0.0, -1.0, 0.5]) / 0.7)
  p /= p.sum()
  freq = np.bincount(np.asarray(tok), minlength=4) / 4000
  assert np.abs(freq - p).max() < 0.03
  np.testing.assert_allclose(np.asarray(lp), np.log(p)[np.asarray(tok)], rtol=1e-5)


def test_deterministic_and_independent_of_batch_composition():
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  prompts = jax.random.randint(jax.random.PRNGKey(1), (3, 5), 1, 50)
  keys = jax.random.split(jax.random.PRNGKey(7), 3)
  s = models.SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=10)
  a = models.generate(params, CFG, prompts, keys=keys, sampling=s)
  b = models.generate(params, CFG, prompts, keys=keys, sampling=s)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  # row 2 alone, with its own key, gives the same tokens as inside the batch
  c = models.generate(params, CFG, prompts[2:], keys=keys[2:], sampling=s)
  np.testing.assert_array_equal(np.asarray(c.tokens[0]), np.asarray(a.tokens[2]))


def test_stop_tokens_end_rows_and_are_counted():
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  prompts = jax.random.randint(jax.random.PRNGKey(1), (4, 5), 1, 50)
  base = models.generate(params, CFG, prompts, sampling=models.SamplingConfig(
      temperature=1.0, max_new_tokens=12), key=jax.random.PRNGKey(3))
  stop = int(base.tokens[0, 3])
  out = models.generate(params, CFG, prompts, sampling=models.SamplingConfig(
      temperature=1.0, max_new_tokens=12, stop_tokens=(stop,)), key=jax.random.PRNGKey(3))
  toks, n = np.asarray(out.tokens), np.asarray(out.lengths)
  for i in range(4):
    bt = np.asarray(base.tokens[i])
    hits = np.flatnonzero(bt == stop)
    expect = hits[0] + 1 if len(hits) else 12
    assert n[i] == expect and bool(out.finished[i]) == bool(len(hits))
    np.testing.assert_array_equal(toks[i, :n[i]], bt[:n[i]])
    assert (toks[i, n[i]:] == 0).all()


def test_decode_windows_cover_every_step_with_enough_slots():
  from jaxrl_sys.models.sampling import decode_windows  # pylint: disable=import-outside-toplevel
  assert decode_windows(16, 128, 144) == ((32, 48), (64, 80), (96, 112), (128, 144))
  assert decode_windows(5, 12, 17) == ((12, 17),)
  assert decode_windows(3, 70, 73) == ((35, 38), (70, 73))


def test_long_greedy_generation_matches_full_forward_recompute():
  """128 new tokens run the decode loop in four windowed segments; every token must still be
  the argmax of a from-scratch forward over the sequence so far, with matching logprobs."""
  cfg = models.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, intermediate_size=64, max_seq_len=160)
  params = models.init_params(cfg, jax.random.PRNGKey(3))
  params = jax.tree_util.tree_map(lambda x: x * 4.0 if x.ndim > 1 else x, params)  # sharper
  toks = np.asarray(jax.random.randint(jax.random.PRNGKey(4), (2, 6), 1, 64), np.int32)
  mask = np.ones_like(toks)
  mask[1, :2] = 0                                                      # left padding
  out = models.generate(params, cfg, toks, mask,
                        sampling=models.SamplingConfig(temperature=0.0, max_new_tokens=128))
  seq = np.concatenate([toks, np.asarray(out.tokens)], axis=1)
  full_mask = np.concatenate([mask, np.ones_like(np.asarray(out.tokens))], axis=1)
  @jax.jit                                               # one program, not op by op
  def full_logp(params, seq, mask):
    hidden = models.forward(params, cfg, seq, attention_mask=mask).hidden
    return jax.nn.log_softmax(models.logits_from_hidden(params, cfg, hidden), axis=-1)

  logp = np.asarray(full_logp(params, jnp.asarray(seq), jnp.asarray(full_mask)))
  pred = logp[:, 5:-1]                                   # predictions for the 128 new tokens
  new = np.asarray(out.tokens)
  np.testing.assert_array_equal(new, pred.argmax(-1))
  np.testing.assert_allclose(np.asarray(out.logprobs),
                             np.take_along_axis(pred, new[..., None], -1)[..., 0], atol=2e-5)


def test_top_k_sampling_draws_only_the_top_k_in_proportion():
  logits = jnp.tile(jnp.array([[0.0, 2.0, 1.0, -1.0, 1.5]]), (6000, 1))
  keys = jax.random.split(jax.random.PRNGKey(8), 6000)
  s = models.SamplingConfig(temperature=1.0, top_k=2)
  tok, lp = sample_tokens(logits, keys, jnp.zeros(6000, jnp.int32), s)
  tok = np.asarray(tok)
  assert set(np.unique(tok)) == {1, 4}
  w = np.exp([2.0, 1.5])
  w /= w.sum()
  assert abs((tok == 1).mean() - w[0]) < 0.03
  full = np.exp([0.0, 2.0, 1.0, -1.0, 1.5])
  full = np.log(full / full.sum())
  np.testing.assert_allclose(np.asarray(lp), full[tok], rtol=1e-5)   # full-distribution logprob


def test_draws_equal_jax_random_categorical_and_argmax_ties_nan():
  """Tokens == `jax.random.categorical` on the same per-step keys (the draw is Gumbel noise plus
  an argmax written as two reductions); `first_argmax` == `jnp.argmax` on ties, -inf rows, +inf
  and NaN."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(16, 97)).astype(np.float32) * 3)
  keys = jax.random.split(jax.random.PRNGKey(7), 16)
  pos = jnp.arange(16, dtype=jnp.int32) * 3
  sampling = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=4)
  tok, logp = sample_tokens(logits, keys, pos, sampling)
  scaled = logits / 0.7
  filt = filter_logits(scaled, 20, 0.9)
  step_keys = jax.vmap(jax.random.fold_in)(keys, pos)
  ref = jax.vmap(jax.random.categorical)(step_keys, filt)
  np.testing.assert_array_equal(np.asarray(tok), np.asarray(ref))
  np.testing.assert_allclose(np.asarray(logp), np.asarray(
      jax.nn.log_softmax(scaled)[jnp.arange(16), ref]), rtol=1e-6)
  z = rng.normal(size=(6, 50)).astype(np.float32)
  z[0, [4, 30]] = 9.0                      # tie: the first
  z[1] = -np.inf                           # all filtered: index 0
  z[2, [7, 40]] = np.nan                   # NaN: the first NaN
  z[3, 11] = np.inf
  z[4] = np.round(z[4])
  np.testing.assert_array_equal(np.asarray(first_argmax(jnp.asarray(z))), np.argmax(z, axis=-1))


def test_decode_loop_carries_tokens_not_logits():
  """The step loop feeds the pending token (the engine's order): no `[batch, vocab]` logits in
  any while loop's carried state (a per-step copy of them on every backend), and greedy tokens
  still follow the prompt's own argmax chain (`generate` at 1 and at 5 new tokens agree)."""
  from jaxrl_sys.models import sampling as sampling_lib  # pylint: disable=import-outside-toplevel
  b, t, v = 3, 4, CFG.vocab_size
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  samp = SamplingConfig(temperature=0.0, max_new_tokens=5)
  args = (params, jnp.ones((b, t), jnp.int32), jnp.ones((b, t), jnp.int32),
          sampling_lib.request_keys(jax.random.PRNGKey(0), b), None)
  text = sampling_lib._generate.lower(  # pylint: disable=protected-access
      *args, config=CFG, sampling=samp, cache_len=t + 5).compile().as_text()
  loops = [line for line in text.splitlines() if " while(" in line]
  assert loops and not [line for line in loops if f"f32[{b},{v}]" in line.split(" while(")[0]]
  five = models.generate(params, CFG, args[1], sampling=samp)
  one = models.generate(params, CFG, args[1], sampling=SamplingConfig(temperature=0.0,
                                                                      max_new_tokens=1))
  np.testing.assert_array_equal(np.asarray(five.tokens)[:, :1], np.asarray(one.tokens))
  assert np.asarray(five.lengths).tolist() == [5] * b

"""Token sampling and the jitted prefill + decode loop.

Randomness is per request and per response position: the key of the token at response index i
of a request with key `k` is `fold_in(k, i)`, so the same request gives the same tokens whatever
its batch, slot or whether it was interrupted and resumed elsewhere.

Logprobs are those of the full distribution at the sampling temperature (before top-k/top-p
truncation), i.e. what the trainer recomputes with the fused logprob op at that temperature.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_sys.models import kv_cache as kvc
from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.models.transformer import forward, last_valid_index, logits_from_hidden


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters."""
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 64
  stop_tokens: tuple[int, ...] = ()

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0 or self.max_new_tokens <= 0:
      raise ValueError("top_k must be >= 0 and max_new_tokens > 0")
    object.__setattr__(self, "stop_tokens", tuple(int(s) for s in self.stop_tokens))


class GenerateOutput(NamedTuple):
  """tokens, logprobs: `[batch, max_new_tokens]` (int32 / float32, zero past `lengths`);
  lengths: `[batch]` int32 number of generated tokens (a stop token counts and is included);
  finished: `[batch]` bool, True when a stop token ended the row."""
  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  finished: jax.Array


# Nucleus (top-p) filtering first looks at this many largest logits (`jax.lax.top_k`) and sorts
# the whole vocabulary only when they hold less than top_p of the probability mass.
NUCLEUS_CANDIDATES = 1024


def _nucleus_cutoff_sorted(logits, top_p: float):
  """Per row, the smallest logit of the nucleus, from a full descending sort `[batch, 1]`."""
  sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  cum_before = jnp.cumsum(probs, axis=-1) - probs
  keep = cum_before < top_p
  return jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)


def _nucleus_cutoff(logits, top_p: float, candidates: int):
  """`_nucleus_cutoff_sorted` without a full sort when it can: the nucleus is a prefix of the
  descending order, so when the `candidates` largest logits hold >= top_p of the mass (under the
  softmax of all logits) the prefix lies inside them and their cumulative sums are exact."""
  vals = jax.lax.top_k(logits, candidates)[0]                       # [batch, c] descending
  logz = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  probs = jnp.exp(vals - logz)
  cum_before = jnp.cumsum(probs, axis=-1) - probs
  enough = cum_before[:, -1] + probs[:, -1] >= top_p
  cutoff = jnp.min(jnp.where(cum_before < top_p, vals, jnp.inf), axis=-1, keepdims=True)
  return jax.lax.cond(jnp.all(enough), lambda: cutoff,
                      lambda: _nucleus_cutoff_sorted(logits, top_p))


def filter_logits(logits, top_k: int, top_p: float,
                  nucleus_candidates: int = NUCLEUS_CANDIDATES):
  """Masks `logits [batch, vocab]` (already temperature-scaled) outside top-k / nucleus top-p.

  The nucleus takes a `jax.lax.top_k` of `nucleus_candidates` logits and falls back to a full
  sort only when those hold less than top_p of the mass (same result either way)."""
  if top_k > 0 and top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    if 0 < nucleus_candidates < logits.shape[-1]:
      cutoff = _nucleus_cutoff(logits, top_p, nucleus_candidates)
    else:
      cutoff = _nucleus_cutoff_sorted(logits, top_p)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return logits


def first_argmax(z):
  """`jnp.argmax(z, axis=-1)` for `z [..., n]` float -> int32 `[...]` (the first maximum, or the
  first NaN), as a max and then a min over the indices holding it: XLA:CPU runs argmax's
  paired (value, index) reduction several times slower than these two."""
  top = jnp.max(z, axis=-1, keepdims=True)
  hit = (z == top) | jnp.isnan(z)
  return jnp.min(jnp.where(hit, jnp.arange(z.shape[-1], dtype=jnp.int32), z.shape[-1]), axis=-1)


def sample_tokens(logits, keys, positions, sampling: SamplingConfig):
  """Samples one token per row.

  Args:
    logits: `[batch, vocab]` float32 raw logits.
    keys: `[batch]` PRNG keys, one per request.
    positions: `[batch]` int32 response index of the token being sampled.
    sampling: the config (static).

  Returns:
    (tokens `[batch]` int32, logprobs `[batch]` float32 under softmax(logits / temperature)).
  """
  logits = logits.astype(jnp.float32)
  if sampling.temperature == 0.0:
    tok = first_argmax(logits)
    logp = jax.nn.log_softmax(logits, axis=-1)
  else:
    scaled = logits / sampling.temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    filt = filter_logits(scaled, sampling.top_k, sampling.top_p)
    step_keys = jax.vmap(jax.random.fold_in)(keys, positions)
    # `jax.random.categorical`'s draw (Gumbel noise, then the first maximum), the argmax
    # written as two plain reductions.
    noise = jax.vmap(lambda k: jax.random.gumbel(k, filt.shape[-1:], filt.dtype))(step_keys)
    tok = first_argmax(filt + noise)
  return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]


def is_stop_token(tok, stop_tokens):
  """bool array shaped like `tok` (int32): True where a token is one of `stop_tokens`."""
  if not stop_tokens:
    return jnp.zeros(tok.shape, bool)
  return jnp.isin(tok, jnp.asarray(stop_tokens, jnp.int32))


def request_keys(key, batch: int):
  """Per-request keys `[batch]` from one key (or pass your own keys)."""
  return jax.random.split(key, batch)


def decode_windows(filled: int, max_steps: int, cache_len: int, min_segment: int = 32,
                   max_segments: int = 4) -> tuple[tuple[int, int], ...]:
  """Splits a decode loop into segments with a growing attention window.

  Every row's cache holds at most `filled` slots when the loop starts and gains one per step,
  so during steps `[.., end)` attention need only read slots `[0, filled + end)`. Each segment
  is its own compiled loop, so there are at most `max_segments` of at least `min_segment`
  steps. Returns `((end_step, kv_window), ...)` covering `[0, max_steps)`.
  """
  n = max(1, min(max_segments, max_steps // min_segment))
  seg = -(-max_steps // n)
  ends = [min(max_steps, seg * (i + 1)) for i in range(n)]
  return tuple((e, min(cache_len, filled + e)) for e in ends)


def _record(step, tok, lp, toks, lps, lengths, done, finished, stop_tokens):
  """Writes response token `step` of the rows not done; returns the new arrays and the token
  each row feeds next (0 for rows already done)."""
  live = ~done
  toks = toks.at[:, step].set(jnp.where(live, tok, 0))
  lps = lps.at[:, step].set(jnp.where(live, lp, 0.0))
  lengths = lengths + live.astype(jnp.int32)
  stop = live & is_stop_token(tok, stop_tokens)
  return toks, lps, lengths, done | stop, finished | stop, jnp.where(live, tok, 0)


def decode_loop(params, config: ModelConfig, sampling: SamplingConfig, cache: kvc.KVCache,
                first_logits, keys, start_index, done, max_steps: int,
                windows: tuple[tuple[int, int], ...] | None = None, moe_state=None):
  """Samples up to `max_steps` tokens from `first_logits [batch, vocab]` onwards.

  `start_index [batch]` is the response index of the first sampled token (non-zero for
  resumed requests); rows with `done` set generate nothing. `windows` (static, from
  `decode_windows`) bounds the cache slots read per segment of steps; None reads the whole
  cache every step. `moe_state`: an MoE policy's balancing state (None = zeros). Returns
  GenerateOutput of width `max_steps` (the tokens produced by this
  loop only).

  Token 0 is sampled from `first_logits`; each step of the loop then feeds the previous token
  and samples the next from the logits it gives (the rollout engine's pending-token order), so
  the loop carries one token per row rather than `[batch, vocab]` logits, and no forward runs
  for a token that is never sampled from.
  """
  b = first_logits.shape[0]
  arrays = (jnp.zeros((b, max_steps), jnp.int32), jnp.zeros((b, max_steps), jnp.float32),
            jnp.zeros((b,), jnp.int32), done, jnp.zeros((b,), bool))
  tok, lp = sample_tokens(first_logits, keys, start_index, sampling)
  *arrays, pending = _record(0, tok, lp, *arrays, sampling.stop_tokens)

  def body(state, kv_window):
    step, cache, pending, toks, lps, lengths, done, finished = state
    out = forward(params, config, pending[:, None], cache=cache, kv_window=kv_window,
                  moe_state=moe_state)
    logits = logits_from_hidden(params, config, out.hidden[:, 0])
    tok, lp = sample_tokens(logits, keys, start_index + step, sampling)
    *arrays, pending = _record(step, tok, lp, toks, lps, lengths, done, finished,
                               sampling.stop_tokens)
    return (step + 1, out.cache, pending, *arrays)

  state = (jnp.int32(1), cache, pending, *arrays)
  for end, kv_window in windows or ((max_steps, None),):
    state = jax.lax.while_loop(lambda st, end=end: (st[0] < end) & ~jnp.all(st[6]),
                               functools.partial(body, kv_window=kv_window), state)
  _, _, _, toks, lps, lengths, _, finished = state
  return GenerateOutput(toks, lps, lengths, finished)


def check_context(config: ModelConfig, prompt_len: int, max_new_tokens: int):
  """Raises ValueError when a prompt plus its budget does not fit the model's context."""
  if prompt_len + max_new_tokens > config.max_seq_len:
    raise ValueError(
        f"prompt longer than the context: prompt length {prompt_len} + max_new_tokens "
        f"{max_new_tokens} > max_seq_len {config.max_seq_len}")


@functools.partial(jax.jit, static_argnames=("config", "sampling", "cache_len"))
def _generate(params, prompt_tokens, prompt_mask, keys, moe_state, *, config, sampling,
              cache_len):
  b, t = prompt_tokens.shape
  cache = kvc.init_cache(config, b, cache_len)
  out = forward(params, config, prompt_tokens, attention_mask=prompt_mask, cache=cache,
                moe_state=moe_state)
  last = last_valid_index(prompt_mask)
  h_last = jnp.take_along_axis(out.hidden, last[:, None, None], axis=1)[:, 0]
  logits = logits_from_hidden(params, config, h_last)
  zeros = jnp.zeros((b,), jnp.int32)
  return decode_loop(params, config, sampling, out.cache, logits, keys, zeros,
                     jnp.zeros((b,), bool), sampling.max_new_tokens,
                     windows=decode_windows(t, sampling.max_new_tokens, cache_len),
                     moe_state=moe_state)


def generate(params, config: ModelConfig, prompt_tokens, prompt_mask=None, *, key=None, keys=None,
             sampling: SamplingConfig = SamplingConfig(), moe_state=None) -> GenerateOutput:
  """Prefill + jitted decode loop.

  Args:
    params: model parameters.
    config: model config.
    prompt_tokens: `[batch, prompt_len]` int32, left- or right-padded.
    prompt_mask: `[batch, prompt_len]` (1 = real token); default all ones.
    key: one PRNG key (split into per-request keys), or
    keys: `[batch]` per-request keys (what the rollout engine uses).
    sampling: SamplingConfig (static).
    moe_state: an MoE policy's balancing state (`models.moe.MoEState`, per-layer routing
      biases); None = zeros.

  Returns:
    GenerateOutput(tokens/logprobs `[batch, max_new_tokens]`, lengths, finished).
  """
  prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
  b, t = prompt_tokens.shape
  if prompt_mask is None:
    prompt_mask = jnp.ones((b, t), jnp.int32)
  check_context(config, t, sampling.max_new_tokens)
  if keys is None:
    keys = request_keys(jax.random.PRNGKey(0) if key is None else key, b)
  cache_len = t + sampling.max_new_tokens
  return _generate(params, prompt_tokens, jnp.asarray(prompt_mask, jnp.int32), keys, moe_state,
                   config=config, sampling=sampling, cache_len=cache_len)

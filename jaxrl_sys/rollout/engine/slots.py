"""Pure jitted functions over the engine's slot cache: prefill, prefix copy and chunked decode.

The slot cache is a `models.KVCache` with one row per slot (`[layers, num_slots, max_len, ...]`).
Every function has static shapes: prefill takes a `[batch_bucket, len_bucket]` token block,
prefix copies move `[num_slots]` rows (unused entries point at the out-of-range slot
`num_slots` and are dropped by the scatter), and decode runs over a `[rows_bucket,
width_bucket]` corner of the cache (slots `[0, rows)`, cache positions `[0, width)`). The
cache argument is donated so updates happen in place.

A slot holds a *pending* token: the last token of its sequence, not yet written to the cache
(the last prompt token for a fresh request, the last generated token afterwards). A decode step
feeds the pending token, samples the next one from the resulting logits and makes it pending.
So every sampled token comes from logits computed by the params of the call that sampled it,
which is what makes per-token weight versions exact across a weight swap.

MoE policies route every token on its own here (`forward`'s per-token routing with a cache: the
stored balancing state, no BIP sweep or capacity drop across the slots), so a request's tokens
do not depend on the requests decoded beside it. Prefill and decode also return the experts
each fed token was routed to (`[.., layers, k]`, `models.moe.route_dtype`), and prefill can
impose recorded routes on chosen positions (a resumed request's prefix is rebuilt with the
experts that produced its logged log-probs). Dense models return None for the routes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_sys.models import kv_cache as kvc
from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.models.sampling import SamplingConfig, is_stop_token, sample_tokens
from jaxrl_sys.models.transformer import forward, logits_from_hidden


def pick_bucket(n: int, buckets) -> int:
  """The smallest bucket >= n (buckets sorted ascending); ValueError when none fits."""
  for b in buckets:
    if n <= b:
      return b
  raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def _write_prefix(cache: kvc.KVCache, k, v, lengths, dst) -> kvc.KVCache:
  """Writes prefixes into slot rows.

  Args:
    cache: the slot cache (`max_len` slots per row).
    k, v: `[layers, n, t, kv_heads, head_dim]` keys/values of n prefixes (t <= max_len).
    lengths: `[n]` int32 number of real tokens of each prefix (<= t).
    dst: `[n]` int32 destination slot; `num_slots` (out of range) drops the entry.

  Returns:
    The cache with rows `dst` holding the prefixes: slots `[0, length)` valid, the rest
    invalid, write_pos = next_position = length.
  """
  t = k.shape[2]
  valid = jnp.arange(cache.max_len)[None, :] < lengths[:, None]
  return kvc.KVCache(
      k=cache.k.at[:, dst, :t].set(k.astype(cache.k.dtype), mode="drop"),
      v=cache.v.at[:, dst, :t].set(v.astype(cache.v.dtype), mode="drop"),
      kv_valid=cache.kv_valid.at[dst].set(valid, mode="drop"),
      write_pos=cache.write_pos.at[dst].set(lengths, mode="drop"),
      next_position=cache.next_position.at[dst].set(lengths, mode="drop"))


def _routes_arg(forced):
  if forced is None:
    return None
  from jaxrl_sys.models.moe import Routes  # pylint: disable=import-outside-toplevel
  experts, mask = forced
  return Routes(experts, mask)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def prefill(params, cache: kvc.KVCache, tokens, lengths, dst, moe_state=None, forced=None, *,
            config: ModelConfig):
  """Prefills a block of right-padded sequences and writes each into one slot.

  Args:
    params: model parameters.
    cache: the slot cache (donated).
    tokens: `[batch, t]` int32, right-padded (t is a prefill bucket <= max_len).
    lengths: `[batch]` int32 real length of each row (0 allowed: resets the slot).
    dst: `[batch]` int32 destination slot per row; `num_slots` for padding rows.
    moe_state: the policy's MoE balancing state (routing biases), or None (dense / zeros).
    forced: MoE only: (experts `[batch, t, layers, k]`, mask `[batch, t]` bool) recorded routes
      imposed where mask is set (the other positions route live), or None.
    config: model config (static).

  Returns:
    (the updated slot cache, routes `[batch, t, layers, k]` the experts of every position
    (`models.moe.route_dtype`; MoE models) or None (dense)).
  """
  b, t = tokens.shape
  mask = (jnp.arange(t)[None, :] < lengths[:, None]).astype(jnp.int32)
  tmp = kvc.init_cache(config, b, t, dtype=cache.k.dtype)
  moe = config.moe is not None
  out = forward(params, config, tokens, attention_mask=mask, cache=tmp, moe_state=moe_state,
                routes=_routes_arg(forced), return_routes=moe)
  routes = out.routes.experts if moe else None
  return _write_prefix(cache, out.cache.k, out.cache.v, lengths, dst), routes


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def extend(params, cache: kvc.KVCache, tokens, lengths, starts, dst, moe_state=None,
           forced=None, *, config: ModelConfig):
  """Appends a block of right-padded sequences to slot rows that keep their first tokens.

  The next turn of a multi-turn episode: the slot that served the previous turn still holds
  the KV of the context up to that turn's last sampled token; only the rest (that token and
  the observation) is prefilled, attending to the kept rows.

  Args:
    params: model parameters.
    cache: the slot cache (donated).
    tokens: `[batch, t]` int32, right-padded extensions (t is a prefill bucket).
    lengths: `[batch]` int32 real length of each extension.
    starts: `[batch]` int32 cached tokens kept in each destination row (positions `[0, start)`).
    dst: `[batch]` int32 destination slot per row; `num_slots` for padding rows.
    moe_state: the policy's MoE balancing state, or None.
    forced: MoE only: (experts `[batch, t, layers, k]`, mask `[batch, t]` bool) recorded routes
      of extension positions imposed where mask is set (the others route live), or None. The
      kept positions keep the routes their KV was computed with (the engine keeps them).
    config: model config (static).

  Returns:
    (the updated slot cache: row `dst[i]` holds `starts[i] + lengths[i]` tokens, routes
    `[batch, t, layers, k]` the experts of every extension position (MoE) or None (dense)).
  """
  n, max_len = cache.k.shape[1], cache.max_len
  rows = jnp.clip(dst, 0, n - 1)
  view = kvc.KVCache(cache.k[:, rows], cache.v[:, rows],
                     jnp.arange(max_len)[None, :] < starts[:, None], starts, starts)
  mask = (jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(jnp.int32)
  moe = config.moe is not None
  out = forward(params, config, tokens, attention_mask=mask, cache=view, moe_state=moe_state,
                routes=_routes_arg(forced), return_routes=moe)
  routes = out.routes.experts if moe else None
  total = starts + lengths
  return kvc.KVCache(
      k=cache.k.at[:, dst].set(out.cache.k.astype(cache.k.dtype), mode="drop"),
      v=cache.v.at[:, dst].set(out.cache.v.astype(cache.v.dtype), mode="drop"),
      kv_valid=cache.kv_valid.at[dst].set(jnp.arange(max_len)[None, :] < total[:, None],
                                          mode="drop"),
      write_pos=cache.write_pos.at[dst].set(total, mode="drop"),
      next_position=cache.next_position.at[dst].set(total, mode="drop")), routes


@functools.partial(jax.jit, static_argnames=("t",), donate_argnames=("cache",))
def copy_prefix(cache: kvc.KVCache, src, dst, lengths, *, t: int) -> kvc.KVCache:
  """Copies the first `lengths[i]` cached tokens of slot `src[i]` into slot `dst[i]`.

  Used for shared prompts: the G samples of a prompt take the KV of one prefill (or of a live
  sibling slot, whose first tokens are the same prompt).

  Args:
    cache: the slot cache (donated).
    src: `[n]` int32 source slots (any valid slot for unused entries).
    dst: `[n]` int32 destination slots (`num_slots` for unused entries: dropped).
    lengths: `[n]` int32 prefix lengths (<= t).
    t: static bucket >= max(lengths), <= max_len: how many cache slots are copied.

  Returns:
    The updated slot cache.
  """
  return _write_prefix(cache, cache.k[:, src, :t], cache.v[:, src, :t], lengths, dst)


@functools.partial(jax.jit, static_argnames=("config", "sampling", "num_steps", "width"),
                   donate_argnames=("cache",))
def decode(params, cache: kvc.KVCache, pending, keys, index, budget, live, moe_state=None, *,
           config: ModelConfig, sampling: SamplingConfig, num_steps: int, width: int):
  """Runs up to `num_steps` decode steps over slots `[0, rows)` (rows = `pending.shape[0]`),
  attending over cache slots `[0, width)`; stops early when no slot is live.

  Rows and width are buckets chosen by the host so that every live row's sequence fits the
  window after the chunk. Slots at or beyond `rows`, and cache slots at or beyond `width`, are
  left untouched, and so are the rows that are not live (the decode runs in place on the
  donated cache: no copy of the window in or out).

  Args:
    params: model parameters.
    cache: the slot cache (donated); live rows hold their sequence minus the pending token.
    pending: `[rows]` int32 token to feed next per slot.
    keys: `[rows, 2]` uint32 raw per-request PRNG keys.
    index: `[rows]` int32 response index of the next sampled token.
    budget: `[rows]` int32 tokens the slot may still generate (>= 1 for live slots).
    live: `[rows]` bool slots that generate.
    moe_state: the policy's MoE balancing state (routing biases), or None (dense / zeros).
    config, sampling: static configs; `sampling.max_new_tokens` is ignored (budget is per slot).
    num_steps: static chunk length.
    width: static attention window (cache slots), >= write_pos + min(budget, num_steps) of
      every live row.

  Returns:
    (cache, tokens `[rows, num_steps]` int32, logprobs `[rows, num_steps]` float32,
    count `[rows]` int32 tokens emitted per slot (they are `tokens[:, :count]`),
    stopped `[rows]` bool ended by a stop token, steps () int32 decode steps run,
    routes `[rows, num_steps, layers, k]` the experts of the token fed at each step, the one
    that produced `tokens[:, step]` (`models.moe.route_dtype`; MoE models, else None)).
  """
  r = pending.shape[0]
  moe = config.moe is not None
  out_tok = jnp.zeros((r, num_steps), jnp.int32)
  out_lp = jnp.zeros((r, num_steps), jnp.float32)
  out_routes = None
  if moe:
    from jaxrl_sys.models.moe import route_dtype  # pylint: disable=import-outside-toplevel
    m = config.moe
    out_routes = jnp.zeros((r, num_steps, config.num_layers, m.num_experts_per_tok),
                           route_dtype(m.num_experts))
  count = jnp.zeros((r,), jnp.int32)
  stopped = jnp.zeros((r,), bool)

  def cond(c):
    return (c[0] < num_steps) & jnp.any(c[5])

  def body(c):
    step, cache, tok, idx, budget, live, stopped, out_tok, out_lp, count, out_routes = c
    out = forward(params, config, tok[:, None], attention_mask=live[:, None], cache=cache,
                  moe_state=moe_state, kv_window=width, return_routes=moe)
    logits = logits_from_hidden(params, config, out.hidden[:, 0])
    new, lp = sample_tokens(logits, keys, idx, sampling)
    out_tok = out_tok.at[:, step].set(jnp.where(live, new, 0))
    out_lp = out_lp.at[:, step].set(jnp.where(live, lp, 0.0))
    if moe:
      out_routes = out_routes.at[:, step].set(out.routes.experts[:, 0])
    inc = live.astype(jnp.int32)
    count, idx, budget = count + inc, idx + inc, budget - inc
    stop = live & is_stop_token(new, sampling.stop_tokens)
    stopped = stopped | stop
    tok = jnp.where(live, new, tok)
    live = live & ~stop & (budget > 0)
    return step + 1, out.cache, tok, idx, budget, live, stopped, out_tok, out_lp, count, out_routes

  init = (jnp.int32(0), cache, pending, index, budget, live, stopped, out_tok, out_lp, count,
          out_routes)
  step, cache, _, _, _, _, stopped, out_tok, out_lp, count, out_routes = jax.lax.while_loop(
      cond, body, init)
  return cache, out_tok, out_lp, count, stopped, step, out_routes


JITTED = (prefill, extend, copy_prefix, decode)


def num_compilations() -> int:
  """Compiled variants of the slot functions in this process (all engines together)."""
  total = 0
  for f in JITTED:
    size = getattr(f, "_cache_size", None)
    total += int(size()) if callable(size) else 0
  return total

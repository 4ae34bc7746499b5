"""The engine's device side: the slot KV cache, the weights it runs (`weights.EngineWeights`) and
the calls of the jitted slot functions (`slots`: prefill, prefix extension, prefix copy, chunked
decode) on them, in bucketed blocks, with their compilations counted. `Engine` decides what goes
where; this module only runs it.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from jaxrl_sys.models import kv_cache as kvc
from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.engine import slots
from jaxrl_sys.rollout.engine.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine.weights import EngineWeights

pick = slots.pick_bucket


class SlotDevice:
  """The slot cache (`cache`, donated to every call and replaced by its result) and the
  weights (`weights`); `stats` counts compilations and copy calls.

  Args:
    model_config, config: the model and the engine's shapes (buckets, slots, sampling).
    weights: the weights the slot functions run.
    stats: the engine's counters (updated in place).
  """

  def __init__(self, model_config: ModelConfig, config: EngineConfig, weights: EngineWeights,
               stats: EngineStats):
    self.model_config, self.config, self.weights, self.stats = model_config, config, weights, stats
    dtype = None if config.cache_dtype is None else jax.numpy.dtype(config.cache_dtype)
    self.cache = kvc.init_cache(model_config, config.num_slots, config.max_len, dtype)
    self.warmed = 0  # variants run by `warmup` so far

  def _call(self, fn, *args, **kwargs):
    size = getattr(fn, "_cache_size", lambda: 0)
    before = size()
    out = fn(*args, **kwargs)
    self.stats.compilations += size() - before
    return out

  def prefill(self, tokens: np.ndarray, lengths: np.ndarray, dst: np.ndarray, forced: Any):
    """`slots.prefill` of a `[b, t]` block into slots `dst`; returns the block's MoE routes
    (`[b, t, layers, k]`, a device array) or None (dense)."""
    params, lora = self.weights.run
    self.cache, routes = self._call(slots.prefill, params, self.cache, tokens, lengths, dst,
                                    self.weights.moe_state, forced, lora,
                                    config=self.model_config)
    return routes

  def extend(self, tokens: np.ndarray, lengths: np.ndarray, starts: np.ndarray, dst: np.ndarray,
             forced: Any):
    """`slots.extend` of a `[b, t]` block of extensions onto the first `starts` cached tokens
    of slots `dst`; returns the extension positions' MoE routes or None (dense)."""
    params, lora = self.weights.run
    self.cache, routes = self._call(slots.extend, params, self.cache, tokens, lengths, starts,
                                    dst, self.weights.moe_state, forced, lora,
                                    config=self.model_config)
    return routes

  def _blocks(self, rows: list, routes: Any):
    """`rows` (first entry: the tokens) cut into `[b, t]` bucketed blocks: yields (part, b, t,
    tokens, lengths, dst, zero forced routes)."""
    c = self.config
    max_b = c.prefill_batch_buckets[-1]
    for i in range(0, len(rows), max_b):
      part = rows[i:i + max_b]
      b = pick(len(part), c.prefill_batch_buckets)
      t = pick(max(len(x[0]) for x in part), c.prefill_buckets)
      toks, lens = np.zeros((b, t), np.int32), np.zeros((b,), np.int32)
      for j, x in enumerate(part):
        toks[j, :len(x[0])], lens[j] = x[0], len(x[0])
      yield (part, b, t, toks, lens, np.full((b,), c.num_slots, np.int32),
             None if routes is None else routes.forced(b, t))

  def prefill_blocks(self, leaders: list[tuple[np.ndarray, int, Any]], routes: Any) -> None:
    """Prefills `(sequence, slot, request)` rows, shortest first, in bucketed blocks; a request
    with recorded routes rebuilds its KV with them; `routes` (`SlotRoutes`, None: dense)
    records each prefix's routes."""
    leaders = sorted(leaders, key=lambda x: len(x[0]))
    for part, b, t, toks, lens, dst, forced in self._blocks(leaders, routes):
      for j, (_, s, r) in enumerate(part):
        dst[j] = s
        if r.num_routed:  # recorded routes (all or a prefix): rebuild the KV with them
          routes.fill(r, 0, forced[0][j], forced[1][j])
      out = self.prefill(toks, lens, dst, forced)
      if out is not None:
        routes.prefilled(out, [(s, len(q)) for q, s, _ in part])
      self.stats.prefill_calls += 1
      self.stats.prefill_rows += len(part)
      self.stats.prefill_tokens += int(lens.sum())
      self.stats.prefill_padded_tokens += b * t

  def extend_blocks(self, extends: list[tuple[np.ndarray, int, int, Any]], routes: Any) -> None:
    """Extends `(new tokens, kept, slot, request)` rows in bucketed blocks (recorded routes of
    extension positions forced; `routes` records the new positions' routes)."""
    for part, _, _, toks, lens, dst, forced in self._blocks(extends, routes):
      starts = np.zeros_like(lens)
      for j, (_, m, s, r) in enumerate(part):
        starts[j], dst[j] = m, s
        if r.num_routed > m:  # recorded routes of extension positions: forced
          routes.fill(r, m, forced[0][j], forced[1][j])
      out = self.extend(toks, lens, starts, dst, forced)
      if out is not None:
        routes.extend_rows(out, [(s, len(q)) for q, _, s, _ in part])
      self.stats.extend_calls += 1
      self.stats.extend_tokens += int(lens.sum())

  def copy(self, moves: list[tuple[int, int, int]]) -> None:
    """Copies `(src, dst, length)` prefixes (any number) in calls of `num_slots` entries."""
    n = self.config.num_slots
    for i in range(0, len(moves), n):
      part = moves[i:i + n]
      src, lens = np.zeros((n,), np.int32), np.zeros((n,), np.int32)
      dst = np.full((n,), n, np.int32)
      for j, (a, d, m) in enumerate(part):
        src[j], dst[j], lens[j] = a, d, m
      t = pick(max(int(lens.max()), 1), self.config.copy_buckets)
      self.cache = self._call(slots.copy_prefix, self.cache, src, dst, lens, t=t)
      self.stats.copy_calls += 1

  def decode(self, width: int, pending, keys, index, budget, live):
    """`slots.decode` of `stream_every` steps over the first `len(pending)` slots; returns its
    outputs after the cache (tokens, logprobs, count, stopped, steps, routes)."""
    c = self.config
    params, lora = self.weights.run
    out = self._call(slots.decode, params, self.cache, pending, keys, index, budget, live,
                     self.weights.moe_state, lora, config=self.model_config,
                     sampling=c.sampling, num_steps=c.stream_every, width=width)
    self.cache = out[0]
    return out[1:]

  def warmup(self, limit: int | None, forced: Callable[[int, int], Any]) -> bool:
    """Runs the prefill / copy / decode variants not run yet (at most `limit`; `forced(b, t)`:
    the zero forced routes of a prefill block); returns whether variants remain."""
    c, n = self.config, self.config.num_slots
    variants = [("prefill", t, b) for t in c.prefill_buckets for b in c.prefill_batch_buckets]
    if c.extend_prefixes:
      variants += [("extend", t, b) for t in c.prefill_buckets for b in c.prefill_batch_buckets]
    variants += [("copy", t, 0) for t in c.copy_buckets]
    variants += [("decode", rows, w) for rows in c.decode_row_buckets
                 for w in c.decode_len_buckets]
    done = self.warmed
    todo = variants[done:] if limit is None else variants[done:done + limit]
    zeros = lambda m: np.zeros((m,), np.int32)  # noqa: E731
    for kind, a, b in todo:
      if kind == "prefill":
        self.prefill(np.zeros((b, a), np.int32), zeros(b), np.full((b,), n, np.int32),
                     forced(b, a))
      elif kind == "extend":
        self.extend(np.zeros((b, a), np.int32), zeros(b), zeros(b), np.full((b,), n, np.int32),
                    forced(b, a))
      elif kind == "copy":
        self.cache = self._call(slots.copy_prefix, self.cache, zeros(n),
                                np.full((n,), n, np.int32), zeros(n), t=a)
      else:
        self.decode(b, zeros(a), np.zeros((a, 2), np.uint32), zeros(a), zeros(a),
                    np.zeros((a,), bool))
    self.warmed = done + len(todo)
    jax.block_until_ready(self.cache)
    return self.warmed < len(variants)

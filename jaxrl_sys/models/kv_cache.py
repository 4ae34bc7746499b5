"""KV cache for incremental decoding with per-sequence write positions.

Slots are indexed per row: `write_pos[b]` is the next free slot of row b, `kv_valid[b, s]`
says whether slot s holds a real token (left-padded prompts leave invalid slots at the front,
right-padded prompts overwrite their pad slots on the next write). `next_position[b]` is the
RoPE position of row b's next token. Causality is by slot index: a query written at slot i sees
valid slots <= i. Every valid slot of row b lies below `write_pos[b]` (the decode kernel skips
the rest).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_sys.models.config import ModelConfig


class KVCache(NamedTuple):
  """Layer-stacked cache. k, v: `[layers, batch, max_len, kv_heads, head_dim]`;
  kv_valid: `[batch, max_len]` bool; write_pos, next_position: `[batch]` int32."""
  k: jax.Array
  v: jax.Array
  kv_valid: jax.Array
  write_pos: jax.Array
  next_position: jax.Array

  @property
  def max_len(self) -> int:
    return self.k.shape[2]

  @property
  def batch(self) -> int:
    return self.k.shape[1]


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
  """An empty cache for `batch` sequences of up to `max_len` slots."""
  dtype = config.cdtype if dtype is None else dtype
  shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
  return KVCache(
      k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
      kv_valid=jnp.zeros((batch, max_len), bool),
      write_pos=jnp.zeros((batch,), jnp.int32),
      next_position=jnp.zeros((batch,), jnp.int32))


def advance(cache: KVCache, mask) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Bookkeeping after writing a chunk with validity `mask [batch, t]`.

  Returns (kv_valid, write_pos, next_position) after the write: the chunk's slots take the
  mask's validity, write_pos moves past the last valid token of the chunk (so trailing pads are
  overwritten next time), next_position advances by the number of valid tokens.
  """
  b, t = mask.shape
  slots = cache.write_pos[:, None] + jnp.arange(t)[None, :]
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
  kv_valid = cache.kv_valid.at[rows, slots].set(mask.astype(bool), mode="drop")
  last = jnp.max(jnp.where(mask, jnp.arange(1, t + 1)[None, :], 0), axis=1)
  return kv_valid, cache.write_pos + last.astype(jnp.int32), (
      cache.next_position + jnp.sum(mask, axis=1).astype(jnp.int32))


def chunk_mask(cache: KVCache, kv_valid_after, t: int):
  """Attention mask `[batch, t, max_len]` for a chunk of t queries written at write_pos."""
  q_slots = cache.write_pos[:, None] + jnp.arange(t)[None, :]
  k_slots = jnp.arange(cache.max_len)[None, None, :]
  return kv_valid_after[:, None, :] & (k_slots <= q_slots[:, :, None])


def select_rows(cache: KVCache, rows) -> KVCache:
  """The cache restricted to `rows [n]` (e.g. to copy a prefilled prompt into G slots)."""
  return KVCache(cache.k[:, rows], cache.v[:, rows], cache.kv_valid[rows],
                 cache.write_pos[rows], cache.next_position[rows])


def update_rows(cache: KVCache, rows, src: KVCache) -> KVCache:
  """Writes `src` (a cache of len(rows) rows, same max_len) into `rows` of `cache`."""
  return KVCache(cache.k.at[:, rows].set(src.k), cache.v.at[:, rows].set(src.v),
                 cache.kv_valid.at[rows].set(src.kv_valid),
                 cache.write_pos.at[rows].set(src.write_pos),
                 cache.next_position.at[rows].set(src.next_position))

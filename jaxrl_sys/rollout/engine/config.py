"""Engine configuration and counters."""
from __future__ import annotations

import dataclasses

from jaxrl_sys.models.sampling import SamplingConfig


def pow2_buckets(lo: int, hi: int) -> tuple[int, ...]:
  """Powers of two from `lo` (clipped to hi) below `hi`, then `hi`: e.g. (16, 32, 64, 100)."""
  out, b = [], max(1, min(lo, hi))
  while b < hi:
    out.append(b)
    b *= 2
  return tuple(out) + (hi,)


def _sorted_buckets(name: str, given, default, hi: int) -> tuple[int, ...]:
  buckets = tuple(sorted({int(b) for b in given})) or default
  if buckets[0] <= 0 or buckets[-1] > hi:
    raise ValueError(f"EngineConfig.{name} must lie in [1, {hi}], got {buckets}")
  return buckets


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static configuration of one engine (every shape the jitted functions see comes from it).

  Attributes:
    num_slots: sequences decoded together at most (the decode batch).
    max_len: cache slots per sequence: prompt + max_new_tokens must fit.
    prefill_buckets: padded prefill lengths (<= max_len); default powers of two from 16, with
      max_len the last.
    prefill_batch_buckets: padded numbers of sequences per prefill call.
    decode_row_buckets: decode runs over slots `[0, rows)`, rows the smallest bucket covering
      the live slots (live requests are packed into low slots); default powers of two from 8,
      with num_slots the last.
    decode_len_buckets: decode attends over cache slots `[0, width)`, width the smallest bucket
      covering the longest live sequence after the chunk; default powers of two from 64, with
      max_len the last. Together these make a step's cost follow the live work (the long tail
      runs on a small, short batch) with a bounded set of compiled shapes.
    stream_every: decode steps per `step()` (tokens per streamed chunk, at most).
    sampling: temperature / top_k / top_p / stop_tokens (its max_new_tokens is unused: the
      budget comes per request).
    share_prefixes: share the KV of identical prefill sequences (GRPO groups) by row copies.
    extend_prefixes: a request whose sequence extends what a free slot still holds (the next
      turn of a multi-turn episode on the engine that served the previous one) takes that slot
      and prefills only the rest (`slots.extend`); free slots are then reused least recently
      released first.
    recompute_kv_on_swap: on a weight load (`Engine.load`), re-prefill running requests with
      the new weights instead of keeping their KV.
    cache_dtype: KV cache dtype name ("float32", "bfloat16"); None = the model compute dtype.
  """
  num_slots: int = 8
  max_len: int = 512
  prefill_buckets: tuple[int, ...] = ()
  prefill_batch_buckets: tuple[int, ...] = (1, 2, 4, 8)
  decode_row_buckets: tuple[int, ...] = ()
  decode_len_buckets: tuple[int, ...] = ()
  stream_every: int = 8
  sampling: SamplingConfig = SamplingConfig()
  share_prefixes: bool = True
  extend_prefixes: bool = False
  recompute_kv_on_swap: bool = False
  cache_dtype: str | None = None

  def __post_init__(self):
    if self.num_slots <= 0 or self.max_len <= 1 or self.stream_every <= 0:
      raise ValueError("EngineConfig: num_slots and stream_every must be > 0 and max_len > 1; "
                       f"got {self.num_slots}, {self.stream_every}, {self.max_len}")
    fix = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
    fix("prefill_buckets", _sorted_buckets(
        "prefill_buckets", self.prefill_buckets, pow2_buckets(16, self.max_len), self.max_len))
    fix("prefill_batch_buckets", _sorted_buckets(
        "prefill_batch_buckets", self.prefill_batch_buckets, (1,), 1 << 30))
    fix("decode_row_buckets", _sorted_buckets(
        "decode_row_buckets", self.decode_row_buckets, pow2_buckets(8, self.num_slots),
        self.num_slots))
    if self.decode_row_buckets[-1] != self.num_slots:
      fix("decode_row_buckets", self.decode_row_buckets + (self.num_slots,))
    fix("decode_len_buckets", _sorted_buckets(
        "decode_len_buckets", self.decode_len_buckets, pow2_buckets(64, self.max_len),
        self.max_len))
    if self.decode_len_buckets[-1] != self.max_len:
      fix("decode_len_buckets", self.decode_len_buckets + (self.max_len,))

  @property
  def copy_buckets(self) -> tuple[int, ...]:
    """Lengths a prefix copy is padded to (prefill and decode-window lengths)."""
    return tuple(sorted(set(self.prefill_buckets) | set(self.decode_len_buckets)))


@dataclasses.dataclass
class EngineStats:
  """Cumulative counters.

  `prefill_rows` / `prefill_tokens` count real sequences / tokens sent through prefill;
  `extend_calls` / `extend_tokens` the prefix extensions and their new tokens, `reused_tokens`
  the cached tokens those (and exact prefix hits) kept instead of prefilling them;
  `prefix_hits` counts admissions that took their prefix from another slot (a shared prompt
  copied from a live sibling or this round's prefill, or still held by a freed slot) instead of
  a prefill; `moved_rows` counts live requests moved to lower slots to shrink the decode batch;
  `decode_row_steps` sums rows x steps actually decoded (the padded work); `compilations`
  counts jit compilations triggered by this engine's calls.
  """
  prefill_calls: int = 0
  prefill_rows: int = 0
  prefill_tokens: int = 0
  prefill_padded_tokens: int = 0
  prefix_hits: int = 0
  extend_calls: int = 0
  extend_tokens: int = 0
  reused_tokens: int = 0
  copy_calls: int = 0
  moved_rows: int = 0
  decode_calls: int = 0
  decode_steps: int = 0
  decode_row_steps: int = 0
  generated_tokens: int = 0
  admitted: int = 0
  completed: int = 0
  aborted: int = 0
  compilations: int = 0

  def as_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)

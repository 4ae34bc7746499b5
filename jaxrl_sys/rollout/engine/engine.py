"""Continuous-batching generation engine for RL rollout (host-side bookkeeping).

The device side is three pure jitted functions in `rollout.engine.slots` (prefill, prefix copy,
chunked decode) over a fixed slot cache, called by `rollout.engine.device.SlotDevice` with the
weights of `rollout.engine.weights.EngineWeights` (with LoRA the frozen base beside the
adapters); this class only decides what goes where (admission, packing and the sequences freed
slots keep: `rollout.engine.placement.SlotPlacement`, its base). Each `step()`:

1. admits waiting requests into free slots (FIFO, lowest slots first). Requests whose prefill
   sequence (prompt, or prompt + partial response for a resumed request, minus the pending last
   token) is identical share one prefill: a request whose prefix is held by a live slot (or by
   a freed slot not reused since) takes it by a row copy (or in place) with no prefill; the
   others are prefilled once per distinct prefix, in `[batch_bucket, len_bucket]` blocks;
2. packs live requests into the lowest slots when that shrinks the decode batch bucket, then
   runs `stream_every` decode steps over the smallest (rows, width) bucket that covers them;
3. turns the new tokens into one `TokenChunk` per live request (tokens, logprobs, the weight
   version), finishes requests on a stop token or an exhausted budget, and frees their slots.

Randomness is `fold_in(request.key, response_index)`, so outputs do not depend on slot,
batch, arrival order or interruption. The host state between steps is exact: `abort()` returns
each request with every token generated so far, ready to be resumed on any engine.

MoE policies: every token is routed on its own (the stored balancing state; no BIP sweep or
capacity drop across slots), so a request's tokens do not depend on its batch-mates. The
experts of every fed position travel with the request (`Request.routes`, streamed in
`TokenChunk.routes`): a prefix's routes are captured once by its prefill and kept per slot on
the host beside the slot's KV, so requests that take the prefix by a row copy take its routes
too; a request that arrives with recorded routes (resumed, migrated, re-queued on a weight
swap) is re-prefilled with them forced, rebuilding its KV with the experts that produced its
logged log-probs (such a prefix is shared only with requests whose routes are the same). A
request may record the routes of a prefix of its positions only (an episode's next turn): those
are forced, the rest routed live. With `extend_prefixes`, a freed slot keeps its sequence's
routes beside its KV: a request extending that sequence keeps them and takes the extension's
(live, or forced where recorded), as a full re-prefill with the kept ones forced would; a slot
whose routes disagree with the request's recorded ones is not extended.

Design choices:
- KV layout: one contiguous `max_len` row per slot, not pages. A paged cache pays off when
  rows are much shorter than `max_len` on average; with the XLA attention of `models.forward`
  (no paged-attention kernel) it needs a gather of every row's pages each step. Here the
  decode window (rows x width buckets) already makes a step's cost follow the live lengths,
  and shared prompts cost one row copy at admission.
- A weight load (`load`) takes effect at the next decode step. By default the KV of
  in-flight requests is kept (computed with the older weights); every token sampled afterwards
  comes from the new weights' logits and carries the new version (the pending-token design of
  `rollout.engine.slots` makes that exact). Prefixes cached under the old weights are not shared
  with new admissions. With `EngineConfig.recompute_kv_on_swap`, running requests are re-queued at
  the front and re-prefilled with the new weights instead.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.engine import slots
from jaxrl_sys.rollout.engine.check import check_request
from jaxrl_sys.rollout.engine.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine.device import SlotDevice
from jaxrl_sys.rollout.engine.placement import SlotPlacement
from jaxrl_sys.rollout.engine.routes import SlotRoutes
from jaxrl_sys.rollout.engine.weights import EngineWeights
from jaxrl_sys.rollout.types import Completion, FinishReason, Request, TokenChunk

pick = slots.pick_bucket


class Engine(SlotPlacement):
  """A continuous-batching engine over `num_slots` slots. Not thread-safe: drive it from one
  thread (`submit`, `step`, `abort`, `load` between steps)."""

  def __init__(self, model_config: ModelConfig, params: Any, config: EngineConfig = EngineConfig(),
               version: int = 0, on_chunk: Callable[[list[TokenChunk]], None] | None = None,
               moe_state: Any = None, base: Any = None):
    """`moe_state` is the policy's MoE balancing state (`models.moe.MoEState`: the routing
    biases of aux-free / BIP balancing steer top-k selection, so rollout must use the trainer's);
    None means zeros for an MoE model. With LoRA (`model_config.lora`), `params` are the
    adapters and `base` the frozen base they apply to: the engine runs `x @ W + s (x @ A) @ B`
    (or, with `lora.merge`, the base merged with the adapters once per version)."""
    if config.max_len > model_config.max_seq_len:
      raise ValueError(f"EngineConfig.max_len={config.max_len} exceeds the model's max_seq_len="
                       f"{model_config.max_seq_len}")
    self.model_config, self.config, self.on_chunk = model_config, config, on_chunk
    self.weights = EngineWeights(model_config, params, moe_state, base)
    self.version = int(version)
    s = config.num_slots
    self._pending = np.zeros((s,), np.int32)   # token to feed next
    self._keys = np.zeros((s, 2), np.uint32)
    self._index = np.zeros((s,), np.int32)     # response index of the next sampled token
    self._budget = np.zeros((s,), np.int32)    # tokens still allowed
    self._written = np.zeros((s,), np.int32)   # cache slots holding the sequence (write_pos)
    self._live = np.zeros((s,), bool)
    self._req: list[Request | None] = [None] * s
    self._prefix: list[bytes | None] = [None] * s  # intact prefill prefix of the slot's rows
    # Free slots: the sequence whose KV their rows still hold (`extend_prefixes`), and when.
    self._held: list[bytes | None] = [None] * s
    self._held_at = np.zeros((s,), np.int64)
    self._releases = 0
    # MoE: each slot's prefix routes and what its request has streamed (`engine.routes`).
    self._routes = None if model_config.moe is None else SlotRoutes(model_config, s)
    self._waiting: collections.deque[Request] = collections.deque()
    self._ids: set[int] = set()
    self._key_of: dict[int, bytes] = {}
    self._waiting_keys: collections.Counter[bytes] = collections.Counter()
    self._done: list[Completion] = []
    self.stats = EngineStats()
    self.device = SlotDevice(model_config, config, self.weights, self.stats)

  # ----- queries -------------------------------------------------------------------------------
  @property
  def params(self) -> Any:
    """The parameters served (with LoRA: the adapters)."""
    return self.weights.params

  @property
  def base(self) -> Any:
    """LoRA: the frozen base the adapters apply to (None without LoRA)."""
    return self.weights.base

  @property
  def cache(self) -> Any:
    """The slot KV cache (`models.kv_cache.KVCache`, replaced by every device call)."""
    return self.device.cache

  @property
  def num_running(self) -> int:
    return int(self._live.sum())

  @property
  def num_waiting(self) -> int:
    return len(self._waiting)

  @property
  def num_unread_completions(self) -> int:
    return len(self._done)

  def has_work(self) -> bool:
    return bool(self._waiting) or bool(self._live.any())

  def running_requests(self) -> list[Request]:
    """Copies of the running requests with their exact partial state (e.g. to checkpoint)."""
    return [dataclasses.replace(self._req[s]) for s in np.flatnonzero(self._live)]

  def waiting_ids(self) -> list[int]:
    """Ids of the requests queued for admission, in queue order."""
    return [r.request_id for r in self._waiting]

  def take_completions(self) -> list[Completion]:
    """Completions finished since the last call (each is returned once)."""
    out, self._done = self._done, []
    return out

  # ----- requests ------------------------------------------------------------------------------
  def submit(self, requests: Sequence[Request] | Request) -> None:
    """Queues requests (fresh or partially generated); validates each against the context."""
    batch = [dataclasses.replace(r) for r in ([requests] if isinstance(requests, Request)
                                               else requests)]  # never mutate the caller's
    ids = [r.request_id for r in batch]
    if len(set(ids)) != len(ids):
      raise ValueError(f"duplicate request ids in one submit: {sorted(ids)}")
    for r in batch:
      self._validate(r)
    stops = self.config.sampling.stop_tokens
    for r in batch:
      self._ids.add(r.request_id)
      if r.num_generated and int(r.tokens[-1]) in stops:
        self._finish(r, FinishReason.STOP)
      elif r.remaining == 0:
        self._finish(r, FinishReason.LENGTH)
      else:
        self._enqueue(r)

  def _validate(self, r: Request) -> None:
    check_request(r, self.model_config, self.config)
    if r.request_id in self._ids:
      raise ValueError(f"request {r.request_id} is already in this engine")
    if r.min_version > self.version:
      raise ValueError(f"request {r.request_id} needs weight version >= {r.min_version}; this "
                       f"engine has version {self.version}")
    if r.routes is not None:
      if self._routes is None:
        raise ValueError(f"request {r.request_id} carries MoE routes but the model is dense")
      self._routes.check(r)

  def _forced(self, b: int, t: int):
    """Zero forced-route arrays of a `[b, t]` prefill (MoE), or None (dense)."""
    return None if self._routes is None else self._routes.forced(b, t)

  def abort(self, request_ids: Iterable[int] | None = None) -> list[Request]:
    """Stops requests (all when None) and returns their exact partial state (resumable).

    Running requests come first (slot order), then waiting ones (queue order). Unknown ids
    (e.g. already completed) are ignored.
    """
    want = None if request_ids is None else {int(i) for i in request_ids}
    out = []
    for s in np.flatnonzero(self._live):
      if want is None or self._req[s].request_id in want:
        out.append(self._req[s])
        self._release(s)
    keep = collections.deque()
    for r in self._waiting:
      if want is None or r.request_id in want:
        out.append(r)
        self._waiting_keys[self._key_of[r.request_id]] -= 1
      else:
        keep.append(r)
    self._waiting = keep
    for r in out:
      self._ids.discard(r.request_id)
      self._key_of.pop(r.request_id, None)
    self.stats.aborted += len(out)
    return out

  def load(self, params: Any, version: int, moe_state: Any = None, base: Any = None) -> None:
    """Uses `params` (same structure, shapes and dtypes; with LoRA the adapters) and
    `moe_state` (MoE models; None = zeros) for every token generated from now on; those tokens
    carry `version`; with LoRA a new `base` (same shapes) replaces the frozen base (None: keep
    it). Running requests keep their KV unless `config.recompute_kv_on_swap`, which re-queues
    them first to be re-prefilled."""
    self.weights.load(params, moe_state, base)
    self.version = int(version)
    self._prefix = [None] * self.config.num_slots  # new admissions prefill with the new weights
    if self._routes is not None:
      self._routes.clear()
    if self.config.recompute_kv_on_swap:
      running = [self._req[s] for s in np.flatnonzero(self._live)]
      for s in np.flatnonzero(self._live):
        self._release(s)
      for r in reversed(running):
        self._enqueue(r, front=True)
    self._held = [None] * self.config.num_slots  # KV of the old weights is not extended

  def _enqueue(self, r: Request, front: bool = False) -> None:
    key = np.concatenate([r.prompt, r.tokens])[:-1].tobytes()
    if r.num_routed:  # a prefix rebuilt with recorded routes is shared only with the same routes
      key += b"|routes|" + r.routes.tobytes()
    self._key_of[r.request_id] = key
    self._waiting_keys[key] += 1
    (self._waiting.appendleft if front else self._waiting.append)(r)

  def _finish(self, r: Request, reason: FinishReason) -> None:
    self._ids.discard(r.request_id)
    self._key_of.pop(r.request_id, None)
    self._done.append(Completion(r, reason))
    self.stats.completed += 1

  # ----- device calls --------------------------------------------------------------------------
  def warmup(self, limit: int | None = None) -> bool:
    """Compiles the prefill / copy / decode variants now (no state change): afterwards a
    stream of requests of any admissible length runs without compiling. With `limit`, runs
    at most that many of the variants earlier calls did not run (a variant already compiled
    by serving is a cheap cache hit). Returns whether variants remain."""
    return self.device.warmup(limit, self._forced)

  def _decode(self, rows: int, width: int, live):
    return self.device.decode(width, self._pending[:rows], self._keys[:rows], self._index[:rows],
                              self._budget[:rows], live)

  def step(self) -> list[TokenChunk]:
    """Admits waiting requests, runs up to `stream_every` decode steps, and returns one chunk
    per request that produced tokens (finished ones have `finish` set and are also queued as
    completions, see `take_completions`)."""
    self._admit()
    if not self._live.any():
      return []
    self._pack()
    c, live = self.config, np.flatnonzero(self._live)
    rows = pick(int(live[-1]) + 1, c.decode_row_buckets)
    need = self._written[live] + np.minimum(self._budget[live], c.stream_every)
    width = pick(int(need.max()), c.decode_len_buckets)
    out = self._decode(rows, width, self._live[:rows].copy())
    (toks, lps, count, stopped, steps, routes), fetched = jax.device_get(
        (out, [] if self._routes is None else self._routes.prefills))
    if self._routes is not None:
      self._routes.resolve(fetched, self._req)
    self.stats.decode_calls += 1
    self.stats.decode_steps += int(steps)
    self.stats.decode_row_steps += int(steps) * rows
    chunks = []
    for s in live:
      n, r = int(count[s]), self._req[s]
      if n == 0:
        continue
      start = r.num_generated
      r.extend(toks[s, :n], lps[s, :n], self.version, None if routes is None else routes[s, :n])
      new_routes = None if routes is None else self._routes.new_routes(s, r)
      self._pending[s] = toks[s, n - 1]
      self._index[s] += n
      self._budget[s] -= n
      self._written[s] += n
      self.stats.generated_tokens += n
      finish = (FinishReason.STOP if stopped[s] else
                FinishReason.LENGTH if self._budget[s] <= 0 else None)
      chunks.append(TokenChunk(r.request_id, start, toks[s, :n].copy(), lps[s, :n].copy(),
                               self.version, finish, new_routes))
      if finish is not None:
        self._release(s)
        self._finish(r, finish)
    if self.on_chunk is not None and chunks:
      self.on_chunk(chunks)
    return chunks

  def run(self, max_steps: int | None = None) -> list[Completion]:
    """Steps until no work is left (or `max_steps`); returns the completions."""
    n = 0
    while self.has_work() and (max_steps is None or n < max_steps):
      self.step()
      n += 1
    return self.take_completions()


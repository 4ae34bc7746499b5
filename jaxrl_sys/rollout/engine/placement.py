"""Where an `Engine`'s requests go in its slot cache (host side): admission of waiting requests
into free slots, packing of live requests into low slots, and what a freed slot keeps for a
request's next turn.

`Engine` (`rollout.engine.engine`) is a `SlotPlacement`: these methods work on the engine's
per-slot host state (set up by `Engine.__init__`, annotated below) and its queue, and run the
copies and prefills they decide through `Engine.device` (`rollout.engine.device.SlotDevice`).

- Free slots are taken lowest first; those holding a prefix a waiting request wants go last,
  and so do (`extend_prefixes`) those holding an extendable sequence, least recently released
  first (an episode's next turn likely comes back for the most recent ones).
- Admission (`_admit`): a request whose prefill prefix (prompt, or prompt + partial response,
  minus the pending last token) a slot holds intact takes it by a row copy (in place when the
  slot is its own) with no prefill; the other distinct prefixes are prefilled once each, and
  the copies run after the round's prefills. With `extend_prefixes`, a request extending the
  sequence a free slot still holds claims that slot (`_claims`) and prefills only the rest.
- Packing (`_pack`): live requests move down into free low slots when that shrinks the decode
  rows bucket; a hole holding an episode's sequence swaps rows with the mover.
- Release (`_release`): a freed slot's prefix stays registered until the slot is reused; with
  `extend_prefixes` it also keeps the sequence its rows hold (MoE: with its routes,
  `SlotRoutes.hold`).
"""
from __future__ import annotations

import collections

import numpy as np

from jaxrl_sys.rollout.engine import slots
from jaxrl_sys.rollout.engine.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine.device import SlotDevice
from jaxrl_sys.rollout.engine.routes import SlotRoutes
from jaxrl_sys.rollout.types import Request

pick = slots.pick_bucket


class SlotPlacement:
  """Admission, packing and release of slots: a base of `Engine` (see the module docstring)."""

  config: EngineConfig
  stats: EngineStats
  device: SlotDevice
  _pending: np.ndarray   # [num_slots] int32 token to feed next
  _keys: np.ndarray      # [num_slots, 2] uint32 request PRNG keys
  _index: np.ndarray     # [num_slots] int32 response index of the next sampled token
  _budget: np.ndarray    # [num_slots] int32 tokens still allowed
  _written: np.ndarray   # [num_slots] int32 cache slots holding the sequence (write_pos)
  _live: np.ndarray      # [num_slots] bool
  _req: list[Request | None]
  _prefix: list[bytes | None]  # intact prefill prefix of the slot's rows
  _held: list[bytes | None]    # free slots: the sequence their rows still hold
  _held_at: np.ndarray         # [num_slots] int64 release count when it was held
  _releases: int
  _routes: SlotRoutes | None
  _waiting: collections.deque[Request]
  _key_of: dict[int, bytes]
  _waiting_keys: collections.Counter[bytes]

  def _release(self, s: int) -> None:
    # the slot's prefix stays registered: its rows stay intact until the slot is reused
    r = self._req[s]
    if self.config.extend_prefixes and r is not None and (
        self._routes is None or self._routes.hold(s, r, int(self._written[s]))):
      self._held[s] = np.concatenate([r.prompt, r.tokens])[:self._written[s]].tobytes()
      self._releases += 1
      self._held_at[s] = self._releases
    self._live[s] = False
    self._req[s] = None

  def _free_order(self) -> list[int]:
    """Free slots, lowest first, those holding a prefix a waiting request wants last."""
    free = [int(s) for s in np.flatnonzero(~self._live)]
    # Slots holding an extendable sequence go last, least recently released first (an
    # episode's next turn likely comes back for the most recent ones).
    return sorted(free, key=lambda s: (self._prefix[s] is not None
                                       and self._waiting_keys[self._prefix[s]] > 0,
                                       self._held[s] is not None,
                                       int(self._held_at[s]) if self._held[s] is not None else 0,
                                       s))

  def _claims(self, free: list[int]) -> dict[int, int]:
    """`extend_prefixes`: request id -> the free slot holding the longest prefix of its
    sequence (each slot claimed once, queue order)."""
    held = [s for s in free if self._held[s] is not None]
    out: dict[int, int] = {}
    if not held:
      return out
    taken: set[int] = set()
    for r in list(self._waiting)[:len(free)]:
      seq, best = np.concatenate([r.prompt, r.tokens])[:-1].tobytes(), None
      for s in held:
        h = self._held[s]
        if (s not in taken and 0 < len(h) <= len(seq) and seq.startswith(h)
            and (best is None or len(h) > len(self._held[best]))
            and (self._routes is None or self._routes.compatible(s, r, len(h) // 4))):
          best = s
      if best is not None:
        out[r.request_id] = best
        taken.add(best)
    return out

  def _admit(self) -> None:
    """Moves waiting requests into free slots: prefix copies or batched prefills."""
    c = self.config
    free = self._free_order()
    if not free or not self._waiting:
      return
    # Slots whose cached prefix is intact: live ones, and free ones not reused since.
    sources: dict[bytes, list[int]] = collections.defaultdict(list)
    for s in range(c.num_slots) if c.share_prefixes else ():
      if self._prefix[s] is not None:
        sources[self._prefix[s]].append(s)
    leaders: list[tuple[np.ndarray, int]] = []
    copies: list[tuple[int, int, int]] = []
    extends: list[tuple[np.ndarray, int, int, Request]] = []  # (new tokens, kept, slot, r)
    claims = self._claims(free) if c.extend_prefixes else {}
    claimed = set(claims.values())
    while self._waiting and free:
      r = self._waiting.popleft()
      key = self._key_of[r.request_id]
      n = len(r.prompt) + r.num_generated - 1   # the prefill prefix: all but the pending token
      self._waiting_keys[key] -= 1
      claim = claims.pop(r.request_id, None)
      if claim is not None and claim in free:
        s, m = claim, len(self._held[claim]) // 4
        claimed.discard(s)
        free.remove(s)
        if self._prefix[s] is not None and s in sources.get(self._prefix[s], ()):
          sources[self._prefix[s]].remove(s)
        if m == n:
          copies.append((s, s, n))  # every row already in place
        else:
          extends.append((np.concatenate([r.prompt, r.tokens])[m:n], m, s, r))
        if self._routes is not None:
          self._routes.extended(s, r, m, n)
        self.stats.reused_tokens += m
      else:
        open_ = [s for s in free if s not in claimed] or free
        own = [s for s in sources.get(key, ()) if s in open_]  # a free slot holding this prefix
        s = own[0] if own else open_[0]
        free.remove(s)
        claimed.discard(s)
        if self._prefix[s] is not None and s in sources.get(self._prefix[s], ()):
          sources[self._prefix[s]].remove(s)
        src = [a for a in sources.get(key, ()) if a != s]  # live, or prefilled this round
        source = None
        if n == 0 or own:
          copies.append((s, s, n))  # reset the slot's metadata, rows already in place
          source = s
        elif src:
          copies.append((src[0], s, n))  # copies run after this round's prefills
          source = src[0]
        else:
          leaders.append((np.concatenate([r.prompt, r.tokens])[:-1], s, r))
        if self._routes is not None:
          self._routes.admitted(s, r, source, n)
        self.stats.prefix_hits += int(n > 0 and bool(own or src))
      if c.share_prefixes:
        sources[key].append(s)
      self._held[s] = None
      self._req[s], self._prefix[s], self._live[s] = r, key, True
      self._pending[s] = r.tokens[-1] if r.num_generated else r.prompt[-1]
      self._keys[s], self._index[s], self._budget[s] = r.key, r.num_generated, r.remaining
      self._written[s] = n
      self.stats.admitted += 1
    self.device.prefill_blocks(leaders, self._routes)
    self.device.extend_blocks(extends, self._routes)
    if copies:
      self.device.copy(copies)

  def _pack(self) -> None:
    """Moves live requests down into free low slots when that shrinks the decode rows bucket.
    A hole holding an episode's sequence (`extend_prefixes`) swaps with the mover: its rows go
    up to the mover's old slot in the same copy call, so packing never costs a next turn its
    prefix."""
    live = np.flatnonzero(self._live)
    target = pick(len(live), self.config.decode_row_buckets)
    if pick(int(live[-1]) + 1, self.config.decode_row_buckets) <= target:
      return
    holes = [s for s in self._free_order() if s < target]
    movers = [int(s) for s in live if s >= target]
    pairs = list(zip(movers, holes))
    moves = [(a, d, int(self._written[a])) for a, d in pairs]
    moves += [(d, a, len(self._held[d]) // 4) for a, d in pairs if self._held[d] is not None]
    self.device.copy(moves)
    for a, d in pairs:
      held, held_at, prefix = self._held[d], self._held_at[d], self._prefix[d]
      for arr in (self._pending, self._keys, self._index, self._budget, self._written):
        arr[d] = arr[a]
      self._req[d], self._prefix[d], self._live[d] = self._req[a], self._prefix[a], True
      self._held[d] = None
      if self._routes is not None:
        self._routes.moved(a, d, swap=held is not None)
      self._req[a], self._live[a] = None, False  # moved, not finished: not an episode's context
      if held is not None:  # the hole's sequence now lives in the mover's old rows
        self._held[a], self._held_at[a], self._prefix[a] = held, held_at, prefix
    self.stats.moved_rows += len(pairs)

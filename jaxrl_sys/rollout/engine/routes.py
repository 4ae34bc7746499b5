"""Host bookkeeping of an MoE policy's routes in the engine (`Engine` holds one `SlotRoutes`).

Per slot, the routes of the slot's prefill prefix (`[length, layers, k]` expert ids), kept beside
the slot's KV rows: a request that takes the prefix by a row copy takes its routes, so a prefix
is routed once per shared-prompt group. Per slot also, how many route positions of the slot's
request its receiver already holds (`emitted`): the request's next chunk carries the rest (the
prefix's routes on its first chunk when the engine routed the prefix itself).

A prefill's routes stay on the device until the step's decode results are fetched (one transfer
for both); `resolve` then hands every admission of the round its prefix routes.

With `EngineConfig.extend_prefixes`, a freed slot also keeps the routes of the whole sequence
its rows hold (`held`: its request's routes, prefix and decoded positions): a request that
extends that sequence (an episode's next turn) keeps those routes for the kept positions, as
it keeps their KV, and takes the extension's routes (captured, or forced where it recorded
them) for the rest, exactly the routes a full re-prefill with the kept ones forced would give.
A request may record routes for a prefix of its fed positions only (`Request.routes`): those
are forced, the rest routed live, and the request then records every position.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.types import Request


class SlotRoutes:
  """Prefix routes per slot, and what each slot's request has streamed of its routes."""

  def __init__(self, model_config: ModelConfig, num_slots: int):
    from jaxrl_sys.models.moe import route_dtype  # pylint: disable=import-outside-toplevel
    m = model_config.moe
    self.shape = (model_config.num_layers, m.num_experts_per_tok)
    self.num_experts = m.num_experts
    self.dtype = np.dtype(route_dtype(m.num_experts))
    self.prefix: list[np.ndarray | None] = [None] * num_slots
    self.emitted = np.zeros((num_slots,), np.int64)
    # Free slots (`extend_prefixes`): the routes of the sequence their rows still hold.
    self.held: list[np.ndarray | None] = [None] * num_slots
    # This round's admissions: (slot, source slot) or (slot, (call index, row, length, kept
    # routes or None)): a prefill row, or an extension of the kept routes.
    self._pending: list[tuple[int, Any]] = []
    self._extending: dict[int, np.ndarray] = {}  # slot -> kept routes, until its call is made
    self.prefills: list[Any] = []  # device route arrays of this round's prefill calls

  def check(self, r: Request) -> None:
    """ValueError when `r`'s recorded routes do not fit the model; casts them to the dtype."""
    if not r.num_routed:
      return
    if tuple(r.routes.shape[1:]) != self.shape or int(r.routes.max()) >= self.num_experts:
      raise ValueError(f"request {r.request_id}: routes of shape {list(r.routes.shape)} (ids up "
                       f"to {int(r.routes.max())}) do not fit this model: [positions, "
                       f"layers={self.shape[0]}, k={self.shape[1]}] with ids below "
                       f"{self.num_experts}")
    r.routes = r.routes.astype(self.dtype)

  def forced(self, b: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero forced-route arrays of a `[b, t]` prefill: (experts `[b, t, layers, k]`, mask)."""
    return np.zeros((b, t) + self.shape, self.dtype), np.zeros((b, t), bool)

  def clear(self) -> None:
    """Prefixes are no longer shared nor extended (new weights)."""
    self.prefix = [None] * len(self.prefix)
    self.held = [None] * len(self.held)

  def hold(self, slot: int, r: Request, length: int) -> bool:
    """`r` leaves `slot` whose rows hold its first `length` positions: keeps their routes for
    an extension (`extended`). False when `r` does not record them all (nothing to extend)."""
    ok = r.num_routed >= length
    self.held[slot] = r.routes[:length] if ok else None
    return ok

  def fill(self, r: Request, start: int, experts: np.ndarray, mask: np.ndarray) -> None:
    """Writes `r`'s recorded routes of sequence positions `[start, start + len(mask))` into
    one row of forced-route arrays (experts `[t, layers, k]`, mask `[t]`)."""
    k = min(r.num_routed - start, len(mask))
    if k > 0:
      experts[:k], mask[:k] = r.routes[start:start + k], True

  def compatible(self, slot: int, r: Request, length: int) -> bool:
    """Whether `r`'s recorded routes agree with the routes `slot` holds on the first `length`
    positions (the kept KV was computed with those experts)."""
    h = self.held[slot]
    k = min(r.num_routed, length)
    return h is not None and len(h) >= length and bool(np.array_equal(h[:k], r.routes[:k]))

  def extended(self, slot: int, r: Request, kept: int, length: int) -> None:
    """`r` takes `slot`, keeping its first `kept` positions (their routes stay), its prefix of
    `length` positions completed by the round's extension call (`extend_rows`) when longer."""
    self.emitted[slot] = r.num_routed
    base = self.held[slot][:kept]
    self.held[slot] = None
    if kept == length:
      self.prefix[slot] = base
      self._pending.append((slot, slot))
    else:
      self._extending[slot] = base

  def extend_rows(self, routes: Any, rows: list[tuple[int, int]]) -> None:
    """An extension call's device routes `[b, t, layers, k]`; `rows`: (slot, new positions)."""
    self.prefills.append(routes)
    i = len(self.prefills) - 1
    self._pending.extend((s, (i, j, n, self._extending.pop(s))) for j, (s, n) in enumerate(rows))

  def admitted(self, slot: int, r: Request, source: int | None, length: int) -> None:
    """`r` enters `slot` with a prefix of `length` positions, taken from slot `source` (itself
    for a prefix in place), or prefilled (`source` None: see `prefilled`)."""
    self.emitted[slot] = r.num_routed
    if length == 0:
      self.prefix[slot] = None
    elif source is not None:
      self._pending.append((slot, source))

  def prefilled(self, routes: Any, rows: list[tuple[int, int]]) -> None:
    """A prefill call's device routes `[b, t, layers, k]`; `rows`: (slot, length) per row."""
    self.prefills.append(routes)
    i = len(self.prefills) - 1
    self._pending.extend((s, (i, j, n, None)) for j, (s, n) in enumerate(rows))

  def resolve(self, fetched: list[np.ndarray], requests: list[Request | None]) -> None:
    """Gives this round's admissions their prefix routes (`fetched`: the prefills' routes on
    the host): prefills first, then copies (a copy's source is a live slot or one of this
    round's prefills). A request that records fewer positions takes them (the recorded ones
    were forced, so they agree; its next chunk sends the rest)."""
    for s, x in sorted(self._pending, key=lambda e: isinstance(e[1], int)):
      if isinstance(x, int):
        self.prefix[s] = self.prefix[x]
      else:
        i, j, n, base = x
        new = np.asarray(fetched[i][j, :n])
        self.prefix[s] = new if base is None else np.concatenate([base, new.astype(base.dtype)])
      r = requests[s]
      if r is not None and self.prefix[s] is not None and r.num_routed < len(self.prefix[s]):
        r.routes = self.prefix[s]
    self._pending, self.prefills = [], []

  def moved(self, src: int, dst: int, swap: bool = False) -> None:
    """A live request moved from slot `src` to `dst` (both hold its prefix rows now; with
    `swap`, `src` holds `dst`'s former held sequence instead)."""
    held, prefix = self.held[dst], self.prefix[dst]
    self.prefix[dst], self.emitted[dst] = self.prefix[src], self.emitted[src]
    self.held[dst] = None
    if swap:
      self.held[src], self.prefix[src] = held, prefix
    self._pending += [(dst, x) for s, x in self._pending if s == src]   # not resolved yet

  def new_routes(self, slot: int, r: Request) -> np.ndarray:
    """The route positions of `r` its receiver does not hold yet (for its next chunk)."""
    out = r.routes[self.emitted[slot]:].copy()
    self.emitted[slot] = r.num_routed
    return out

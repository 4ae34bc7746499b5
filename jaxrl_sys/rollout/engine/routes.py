"""Host bookkeeping of an MoE policy's routes in the engine (`Engine` holds one `SlotRoutes`).

Per slot, the routes of the slot's prefill prefix (`[length, layers, k]` expert ids), kept beside
the slot's KV rows: a request that takes the prefix by a row copy takes its routes, so a prefix
is routed once per shared-prompt group. Per slot also, how many route positions of the slot's
request its receiver already holds (`emitted`): the request's next chunk carries the rest (the
prefix's routes on its first chunk when the engine routed the prefix itself).

A prefill's routes stay on the device until the step's decode results are fetched (one transfer
for both); `resolve` then hands every admission of the round its prefix routes.
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
    # This round's admissions: (slot, source slot) or (slot, (prefill index, row, length)).
    self._pending: list[tuple[int, Any]] = []
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
    """Prefixes are no longer shared (new weights)."""
    self.prefix = [None] * len(self.prefix)

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
    self._pending.extend((s, (i, j, n)) for j, (s, n) in enumerate(rows))

  def resolve(self, fetched: list[np.ndarray], requests: list[Request | None]) -> None:
    """Gives this round's admissions their prefix routes (`fetched`: the prefills' routes on
    the host): prefills first, then copies (a copy's source is a live slot or one of this
    round's prefills). A request without recorded routes takes them (its next chunk sends
    them)."""
    for s, x in sorted(self._pending, key=lambda e: isinstance(e[1], int)):
      if isinstance(x, int):
        self.prefix[s] = self.prefix[x]
      else:
        i, j, n = x
        self.prefix[s] = np.asarray(fetched[i][j, :n])
      r = requests[s]
      if r is not None and not r.num_routed and self.prefix[s] is not None:
        r.routes = self.prefix[s]
    self._pending, self.prefills = [], []

  def moved(self, src: int, dst: int) -> None:
    """A live request moved from slot `src` to `dst` (both hold its prefix rows now)."""
    self.prefix[dst], self.emitted[dst] = self.prefix[src], self.emitted[src]
    self._pending += [(dst, x) for s, x in self._pending if s == src]   # not resolved yet

  def new_routes(self, slot: int, r: Request) -> np.ndarray:
    """The route positions of `r` its receiver does not hold yet (for its next chunk)."""
    out = r.routes[self.emitted[slot]:].copy()
    self.emitted[slot] = r.num_routed
    return out

"""Weight pulls over the frontend network: a fluid model of the training nodes' NICs.

Each rollout instance is paired round-robin with one training node's transfer agent and pulls
the new weights from it point-to-point (RLBoost, RLBOOST.md 1.4). A pull is a flow of
`bytes`; the flows on one sender share its NIC equally and each is capped by its receiver's
link, so with `n` flows on a sender each moves at

    rate = min(receiver_gbps, sender_gbps / n) * efficiency                [bit/s]

(equal shares are max-min fair for equal receivers). A sender serves at most
`network.sender_streams` flows at once (RLBoost's release: 4 transfer groups per sender); later
pulls wait in arrival order and start as earlier ones finish, so a large fleet queues on the
link instead of slowing every transfer down together: with 60 instances pulling Qwen3-14B from
one node, the first four serve after 4.7 s and the last after ~71 s (all at ~71 s without the
queue). Rates change whenever a flow starts or ends; `advance(t)` integrates the flows through
those changes in order, so a pull that starts while others run takes longer than one alone -
`network.transfer_time` is the special case of flows that start together (and fit the streams).

`SyncGroup` is the synchronous-push ablation: at a step start the trainer pushes the version to
every instance that is up, and none serves it before the slowest receiver has it.
"""
from __future__ import annotations

import math

from jaxrl_sys.sim.hardware import Network


class Flow:
  """One pull: `remaining` bits to move from sender `sender`, asked for at `start`; `active`
  once the sender serves it (it waits in the sender's queue before)."""
  __slots__ = ("key", "sender", "remaining", "total", "start", "done_at", "active", "seq")

  def __init__(self, key: str, sender: int, bits: float, start: float, seq: int):
    self.key, self.sender, self.remaining, self.total = key, sender, bits, bits
    self.start, self.done_at, self.active, self.seq = start, None, False, seq


class SenderPool:
  """The transfer agents of `n_senders` training nodes (see the module docstring)."""

  def __init__(self, n_senders: int, network: Network):
    if n_senders < 1:
      raise ValueError(f"SenderPool needs at least one sender, got {n_senders}")
    self.n_senders, self.network = n_senders, network
    self.flows: dict[str, Flow] = {}
    self.t = 0.0
    self.bits_moved = 0.0
    self._seq = 0

  def _admit(self) -> None:
    """Starts queued flows, oldest first, while their sender has a free stream."""
    limit = self.network.sender_streams
    busy: dict[int, int] = {}
    queued = []
    for f in self.flows.values():
      if f.done_at is None:
        if f.active:
          busy[f.sender] = busy.get(f.sender, 0) + 1
        else:
          queued.append(f)
    for f in sorted(queued, key=lambda x: x.seq):
      if limit is None or busy.get(f.sender, 0) < limit:
        f.active = True
        busy[f.sender] = busy.get(f.sender, 0) + 1

  def _rates(self) -> dict[str, float]:
    net = self.network
    per: dict[int, int] = {}
    for f in self.flows.values():
      if f.done_at is None and f.active:
        per[f.sender] = per.get(f.sender, 0) + 1
    return {k: min(net.receiver_gbps, net.sender_gbps / per[f.sender]) * 1e9 * net.efficiency
            for k, f in self.flows.items() if f.done_at is None and f.active}

  def queued(self) -> int:
    """Pulls waiting for a free stream of their sender."""
    return sum(1 for f in self.flows.values() if f.done_at is None and not f.active)

  def advance(self, t: float) -> None:
    """Moves every flow forward to time `t`, finishing flows (and re-sharing, and starting
    queued ones) on the way."""
    while self.t < t:
      self._admit()
      rates = self._rates()
      if not rates:
        self.t = t
        return
      dt_done = min(self.flows[k].remaining / r for k, r in rates.items())
      dt = min(dt_done, t - self.t)
      for k, r in rates.items():
        f = self.flows[k]
        f.remaining -= r * dt
        self.bits_moved += r * dt
        if f.remaining <= 1e-9 * f.total:
          f.remaining, f.done_at = 0.0, self.t + dt
      self.t += dt

  def start(self, key: str, sender: int, nbytes: float, t: float) -> None:
    """Starts (or restarts) the flow `key` at time `t`."""
    self.advance(t)
    self._seq += 1
    self.flows[key] = Flow(key, sender % self.n_senders, 8.0 * nbytes, t, self._seq)
    if nbytes <= 0:
      self.flows[key].done_at = t
    self._admit()

  def cancel(self, key: str, t: float) -> None:
    self.advance(t)
    self.flows.pop(key, None)
    self._admit()

  def done_at(self, key: str) -> float | None:
    """When flow `key` finished (None: still running or unknown)."""
    f = self.flows.get(key)
    return None if f is None else f.done_at

  def eta(self, key: str) -> float:
    """Projected finish time of flow `key` at the current rates (inf if unknown)."""
    f = self.flows.get(key)
    if f is None:
      return math.inf
    if f.done_at is not None:
      return f.done_at
    rates = self._rates()
    if key in rates:
      return self.t + f.remaining / rates[key]
    # Queued: no earlier than the next finish on its sender (the sim then looks again).
    same = [self.t + g.remaining / rates[k] for k, g in self.flows.items()
            if k in rates and g.sender == f.sender]
    return min(same, default=self.t)

  def pop(self, key: str) -> Flow | None:
    flow = self.flows.pop(key, None)
    self._admit()
    return flow


class SyncGroup:
  """The receivers of one synchronous push (version `version`, started at `start`)."""

  def __init__(self, version: int, start: float, members: list[str]):
    self.version, self.start, self.members = version, start, list(members)
    self.done_at: float | None = None

  def update(self, pool: SenderPool, alive) -> None:
    """Finishes the group once every live member's flow is done (the slowest receiver)."""
    if self.done_at is not None:
      return
    live = [m for m in self.members if alive(m)]
    times = [pool.done_at(m) for m in live]
    if all(t is not None for t in times):
      self.done_at = max(times, default=self.start)

  def eta(self, pool: SenderPool, alive) -> float:
    if self.done_at is not None:
      return self.done_at
    return max((pool.eta(m) for m in self.members if alive(m)), default=self.start)

"""The simulated cluster: what the simulated workers share, and the ledger of instance time.

`SimCluster` holds the virtual clock, the model preset, the engine model, the training nodes'
transfer agents (`senders.SenderPool`), the trace player (whose next event bounds every clock
advance, so a preemption happens at its trace time) and, per instance, when it was asked for and
when it ended - what the cost model charges (`instance_seconds`). It builds workers: the
trainer's local engines (`make_local`) and remote instances (`make_remote`, the `Fleet`'s
factory), each paired round-robin with a training node.

Weight delivery has two modes: pull (RLBoost: an instance pulls the newest version itself when
the manager tells it to, from the moment it is up) and synchronous push (the ablation:
`broadcast(version)` at a step start pushes to every instance up at that moment, none serves the
version before the slowest has it, and instances that start later wait for the next step).
"""
from __future__ import annotations

import math

import numpy as np

from jaxrl_sys.rollout.clock import ManualClock
from jaxrl_sys.sim.engine import EngineModel
from jaxrl_sys.sim.hardware import GCP_A3, Network
from jaxrl_sys.sim.presets import ModelPreset
from jaxrl_sys.sim.senders import SenderPool, SyncGroup
from jaxrl_sys.sim.startup import COLD_VM, Startup, startup_delay
from jaxrl_sys.sim.worker import SimWorker


class SimCluster:
  """Shared state of the simulated workers (see the module docstring).

  Args:
    clock: the virtual clock.
    preset: model and hardware figures.
    engine_model: scheduler / reporting settings of every instance.
    n_senders: training nodes serving weight pulls.
    network: frontend links.
    startup: start-up delay of a remote instance.
    rng: seeded generator for start-up jitter.
    sync_push: synchronous push instead of pull.
    player: the trace player (`next_time()`), or None.
    warm_until: instances asked for up to this time are already up (no start-up delay): the
      nodes live when a trace segment begins were running before it.
  """

  def __init__(self, clock: ManualClock, preset: ModelPreset, engine_model: EngineModel, *,
               n_senders: int = 1, network: Network = GCP_A3, startup: Startup = COLD_VM,
               rng: np.random.Generator | None = None, sync_push: bool = False, player=None,
               warm_until: float = -math.inf):
    self.clock, self.preset, self.engine_model = clock, preset, engine_model
    self.pool = SenderPool(n_senders, network)
    self.startup, self.rng = startup, rng if rng is not None else np.random.default_rng(0)
    self.sync_push, self.player = sync_push, player
    self.warm_until = warm_until
    self.workers: dict[str, SimWorker] = {}
    self.dying: set[str] = set()  # preempted, fatal report not yet taken
    self.groups: list[SyncGroup] = []
    self.stalls = self.due_now = 0
    self.due_at = -1.0
    self.manager = None
    self._pairs = 0
    self.pull_seconds: list[float] = []  # each finished remote pull: asked for -> loaded

  # ----- workers -------------------------------------------------------------------------------
  def make_local(self, worker_id: str) -> SimWorker:
    w = SimWorker(worker_id, self, local=True, ready_at=self.clock.now())
    self.workers[worker_id] = w
    return w

  def make_remote(self, worker_id: str) -> SimWorker:
    now = self.clock.now()
    delay = 0.0 if now <= self.warm_until else startup_delay(self.startup, self.rng)
    w = SimWorker(worker_id, self, local=False, ready_at=now + delay,
                  sender=self._pairs % self.pool.n_senders)
    self._pairs += 1
    self.workers[worker_id] = w
    return w

  def remote(self) -> list[SimWorker]:
    return [w for w in self.workers.values() if not w.local and w.alive()]

  def local(self) -> list[SimWorker]:
    return [w for w in self.workers.values() if w.local and w.alive()]

  def has_commands(self, worker_id: str) -> bool:
    """Whether the manager holds commands for `worker_id` (read-only: the simulated long poll
    returns early so that they go out, as a real worker's 50 ms long poll lets them)."""
    return self.manager is not None and self.manager.fleet.has_commands(worker_id)

  def next_external(self) -> float:
    """Clock time of the next trace event (inf: none)."""
    t = self.player.next_time() if self.player is not None else None
    return math.inf if t is None else t

  def reap(self, manager, now: float) -> None:
    """Tick hook: an instance the manager dropped (retired by the fleet) is released."""
    for wid, w in self.workers.items():
      if w.ended is None and not w.local and wid not in manager.fleet:
        w.kill()

  def on_end(self, w: SimWorker, now: float) -> None:
    self.pool.cancel(w.worker_id, now)

  def instance_seconds(self, start: float, end: float, local: bool = False) -> float:
    """Instance-seconds of (remote or local) instances within [start, end]: from the request to
    the preemption, kill or release."""
    total = 0.0
    for w in self.workers.values():
      if w.local == local:
        a, b = max(w.created, start), min(end if w.ended is None else w.ended, end)
        total += max(b - a, 0.0)
    return total

  def live_remote_at(self, t: float) -> int:
    return sum(1 for w in self.workers.values()
               if not w.local and w.created <= t and (w.ended is None or w.ended > t))

  # ----- weights -------------------------------------------------------------------------------
  def begin_pull(self, w: SimWorker, version: int, now: float) -> bool:
    """The manager told `w` to load `version`; True when a transfer towards it is under way."""
    if not self.sync_push:
      self.pool.start(w.worker_id, w.sender, self.preset.weight_bytes, now)
      return True
    return any(g.version == version and w.worker_id in g.members for g in self.groups)

  def pull_done(self, w: SimWorker, now: float) -> float | None:
    """When `w`'s pull of `w.loading` finished, if by `now` (None: not yet)."""
    self.pool.advance(now)
    if not self.sync_push:
      done = self.pool.done_at(w.worker_id)
      if done is not None and done <= now:
        self.pool.pop(w.worker_id)
        return done
      return None
    for g in self.groups:
      if g.version == w.loading and w.worker_id in g.members:
        g.update(self.pool, self._alive)
        return g.done_at if g.done_at is not None and g.done_at <= now else None
    return None

  def pull_eta(self, w: SimWorker) -> float:
    if not self.sync_push:
      return self.pool.eta(w.worker_id)
    for g in self.groups:
      if g.version == w.loading and w.worker_id in g.members:
        return g.eta(self.pool, self._alive)
    return math.inf

  def broadcast(self, version: int) -> None:
    """Synchronous push of `version` to every remote instance up now (the ablation)."""
    if not self.sync_push:
      return
    now = self.clock.now()
    self.groups = [g for g in self.groups if g.done_at is None or g.version >= version - 1]
    members = [w.worker_id for w in self.remote() if w.ready_at <= now]
    for wid in members:
      self.pool.start(wid, self.workers[wid].sender, self.preset.weight_bytes, now)
    self.groups.append(SyncGroup(version, now, members))

  def can_serve(self, version: int) -> bool:
    """Whether some live remote instance serves `version` or will this step."""
    for w in self.remote():
      if w.version >= version:
        return True
      if not self.sync_push and w.ready_at < math.inf:
        return True
      if any(g.version == version and w.worker_id in g.members for g in self.groups):
        return True
    return False

  def _alive(self, wid: str) -> bool:
    w = self.workers.get(wid)
    return w is not None and w.alive()

"""A simulated rollout instance that implements `rollout.workers.Worker` on the virtual clock.

The real `RolloutManager` drives it exactly like a Ray worker: `send(Commands)` starts an
exchange (aborts, a weight pull, requests to start or resume), `receive()` returns the
`WorkerReport` once it is due, or raises `WorkerLost`. Behind the protocol a `SimEngine` decodes
on virtual time; each request's final length is its `Request.meta["target"]` (drawn by the
driver; the manager carries meta along, so a migrated request keeps it), tokens are zeros.

Life of an instance: created when the fleet asks for it, silent until its start-up delay has
passed, then it pulls the newest weights (a flow on its paired training node's NIC,
`senders.SenderPool`; trainer-local engines get them at once over NVLink) and serves.

Reports are coarse: every `report_interval` virtual seconds (the heartbeat), and
`min_report_interval` after a finish, an abort acknowledgement or a finished pull. Finished and
aborted requests carry all their tokens; running ones stream theirs every `stream_interval`.
A spot reclaim (`preempt()`, called by the fleet on a trace `remove`) ends the instance: its
next report is `fatal` and carries each request's tokens up to its last `stream_tokens` chunk
(what the manager would have received from a token stream before the kill); the manager then
migrates every request. `wait_any` moves the clock to the earliest next event of the workers
and the cluster (trace events).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxrl_sys.rollout.types import FinishReason, Request, TokenChunk
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerLost, WorkerReport
from jaxrl_sys.sim.engine import Seq, SimEngine

_ZI = np.zeros(1 << 15, np.int32)
_ZF = np.zeros(1 << 15, np.float32)


def _chunk(rid: int, start: int, n: int, version: int, finish=None) -> TokenChunk:
  z_i = _ZI[:n] if n <= len(_ZI) else np.zeros(n, np.int32)
  z_f = _ZF[:n] if n <= len(_ZF) else np.zeros(n, np.float32)
  return TokenChunk(rid, start, z_i, z_f, version, finish)


class SimWorker:
  """One simulated instance (see the module docstring).

  Args:
    worker_id: its name.
    cluster: the `SimCluster` it lives in (clock, preset, network, trace).
    local: a rollout engine on the trainer's own GPUs (weights arrive with the reshard).
    ready_at: virtual time its start-up ends.
    sender: index of the training node it pulls weights from.
  """
  synchronous = False

  def __init__(self, worker_id: str, cluster, *, local: bool, ready_at: float, sender: int = 0):
    self.worker_id, self.cluster, self.local, self.sender = worker_id, cluster, local, sender
    self.clock = cluster.clock
    self.model = cluster.engine_model
    self.created = self.clock.now()
    self.ready_at = max(ready_at, self.created)
    preset = cluster.preset.local() if local else cluster.preset
    self.engine = SimEngine(preset, self.model, self.ready_at)
    self.version = self.loading = -1
    self.pull_started = 0.0
    self.deferred: int | None = None   # a version to pull once started up
    self.pending: Commands | None = None
    self.sent_at = self.created
    self.out: list[TokenChunk] = []
    self.pulls: list[tuple[int, float]] = []
    self.registered = False
    self.announce = False
    self.seq = 0
    self.last_stream = self.ready_at
    self.dying = self.dead = False
    self.ended: float | None = None
    self._quiet = -math.inf  # no look needed before this time (cache of _next_attention)

  # ----- protocol ------------------------------------------------------------------------------
  def send(self, commands: Commands) -> None:
    if self.pending is not None:
      raise RuntimeError(f"worker {self.worker_id}: an exchange is already outstanding")
    now = self.clock.now()
    self.pending, self.sent_at, self._quiet = commands, now, -math.inf
    if self.dying or self.dead:
      return
    self._sync(now)
    for rid in commands.abort:
      s = self.engine.remove(int(rid))
      if s is not None and s.gen0 > s.reported:
        self.out.append(_chunk(s.rid, s.reported, s.gen0 - s.reported, self.version))
      self.out.append(_chunk(int(rid), -1, 0, self.version, FinishReason.ABORTED))
    if commands.load is not None:
      self._load(int(commands.load.version), now)
    for r in commands.submit:
      self._submit(r, now)

  def receive(self) -> WorkerReport | None:
    if self.dead:
      raise WorkerLost(f"{self.worker_id} was preempted")
    if self.pending is None:
      return None
    now = self.clock.now()
    if self.dying:
      self.dead = True
      self.cluster.dying.discard(self.worker_id)
      return self._report("preempted (spot reclaim)")
    if now < self._quiet and self.loading < 0 and not self.cluster.has_commands(self.worker_id):
      return None
    self._sync(now)
    if now >= self._due():
      return self._report()
    self._quiet = self._next_attention(now)
    return None

  def kill(self) -> None:
    self.cluster.dying.discard(self.worker_id)
    if not self.dead:
      self.dead = True
      self._end(self.clock.now())

  def preempt(self) -> None:
    """A spot reclaim now: the next report is fatal and carries the streamed tokens."""
    if self.dying or self.dead:
      return
    now = self.clock.now()
    if now >= self.ready_at:
      self._sync(now)
    e, step = self.engine, self.model.stream_tokens
    for s in e.held():
      g = e.tokens(s)
      keep = g - (g - s.start_here) % step
      if keep > s.reported:
        self.out.append(_chunk(s.rid, s.reported, keep - s.reported, self.version))
        s.reported = keep
    self.dying = True
    self.cluster.dying.add(self.worker_id)
    self._quiet = -math.inf
    self._end(now)

  @classmethod
  def wait_any(cls, workers: Sequence["SimWorker"], timeout: float, clock) -> None:
    """Advances the clock to the earliest next event of `workers` or of their cluster (trace
    events), at most `timeout` seconds ahead."""
    now = clock.now()
    t = now + max(timeout, 0.0)
    if workers:
      c = workers[0].cluster
      if c.dying:  # a preempted worker's fatal report is due now (it may be between exchanges)
        return
      t = min(t, c.next_external())
    for w in workers:
      t = min(t, w.wake_time(now))
    if t <= now and workers:
      # Something is due now (e.g. commands queued after its receive this round): the next
      # round takes it. Twice at the same time would loop, so then step past it.
      c = workers[0].cluster
      c.due_now = c.due_now + 1 if c.due_at == now else 1
      c.due_at = now
      if c.due_now <= 2:
        return
      c.stalls += 1
      t = now + 1e-6
    clock.set(max(t, now))

  # ----- state ---------------------------------------------------------------------------------
  def alive(self) -> bool:
    return not (self.dying or self.dead)

  def wake_time(self, now: float) -> float:
    """Virtual time at which this worker next needs attention (a report or an internal event)."""
    if self.pending is None:
      return math.inf
    if self.dying or self.dead:
      return now
    if now < self._quiet and self.loading < 0:
      t = self._quiet
      if self.cluster.has_commands(self.worker_id):
        t = min(t, max(self.sent_at + self.model.command_latency, now))
      return t
    self._sync(now)
    self._quiet = self._next_attention(now)
    return min(self._quiet, max(self._due(), now))

  def _next_attention(self, now: float) -> float:
    """Earliest time this worker's state needs a look without outside input: its report being
    due, an engine event, the end of its start-up or weight pull (not cached while pulling: the
    pull's end moves when other pulls start or end)."""
    if now < self.ready_at:
      return self.ready_at
    t = min(self._due(), self.engine.next_event())
    return min(t, self.cluster.pull_eta(self)) if self.loading >= 0 else t

  def freeze(self, now: float) -> None:
    self.engine.freeze(now)
    self._quiet = -math.inf

  def thaw(self, now: float) -> None:
    self.engine.thaw(now)
    self._quiet = -math.inf

  def _due(self) -> float:
    """When the outstanding exchange returns: soon when either side has news (the real
    worker's long poll returns within `command_latency`), else at the heartbeat."""
    m = self.model
    if self.cluster.has_commands(self.worker_id):
      return self.sent_at + m.command_latency
    if self.out or self.pulls or self.announce or self.engine.changed:
      return self.sent_at + m.min_report_interval
    return self.sent_at + m.report_interval

  def _sync(self, now: float) -> None:
    """Brings the engine and the weight pull up to `now`; finished requests become chunks."""
    if now < self.ready_at:
      return
    if not self.registered:
      self.registered = self.announce = True
      if self.deferred is not None:
        v, self.deferred = self.deferred, None
        self._load(v, self.ready_at)
    self.engine.advance(now)
    if self.loading >= 0:
      done = self.cluster.pull_done(self, now)
      if done is not None:
        self.version, v = self.loading, self.loading
        self.loading = -1
        self.pulls.append((v, done - self.pull_started))
        self.cluster.pull_seconds.append(done - self.pull_started)
    for s, _ in self.engine.take_finished():
      finish = FinishReason.LENGTH if s.target >= s.budget else FinishReason.STOP
      self.out.append(_chunk(s.rid, s.reported, s.target - s.reported, self.version, finish))
      s.reported = s.target

  def _load(self, version: int, now: float) -> None:
    if version <= self.version:
      return
    if self.local:
      self.version = version
      self.pulls.append((version, 0.0))
    elif now < self.ready_at:
      self.deferred = version
    elif self.cluster.begin_pull(self, version, now):
      self.loading, self.pull_started = version, now

  def _submit(self, r: Request, now: float) -> None:
    target = int(r.meta.get("target", r.max_new_tokens))
    self.engine.add(Seq(r.request_id, r.group_id, len(r.prompt), r.num_generated, target,
                        r.max_new_tokens, now))

  def _end(self, now: float) -> None:
    if self.ended is None:
      self.ended = now
      self.cluster.on_end(self, now)

  def _report(self, fatal: str | None = None) -> WorkerReport:
    now, e = self.clock.now(), self.engine
    if fatal is None and now - self.last_stream >= self.model.stream_interval:
      self.last_stream = now
      for s in e.held():
        g = e.tokens(s)
        if g > s.reported:
          self.out.append(_chunk(s.rid, s.reported, g - s.reported, self.version))
          s.reported = g
    rep = WorkerReport(
        self.worker_id, self.seq, self.out, self.version, self.loading, list(e.running),
        [s.rid for s in e.waiting], e.effective_slots(),
        np.asarray(e.take_profile(), np.float64).reshape(-1, 3), self.pulls, fatal=fatal)
    self.seq += 1
    self.out, self.pulls, self.announce, self.pending = [], [], False, None
    e.changed = False
    return rep

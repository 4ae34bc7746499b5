"""A scripted worker on a `ManualClock`: latency, per-request lengths, deaths and hangs.

Tokens are a pure function of the request key and the response index (`fake_token`), so a
request's final response does not depend on which workers served it or how often it moved:
the same property the real engine gets from `fold_in(request key, index)`. `expected(r)` is the
independent reference of a request's final tokens.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_sys.rollout import (Commands, FinishReason, ManualClock, Request, TokenChunk,
                               WorkerLost, WorkerReport)

VOCAB, STOP = 50, 0


def fake_token(key: np.ndarray, index: int) -> int:
  """Token `index` of the request with raw key `key` (stop token 0 about 1 time in 50)."""
  k = np.asarray(key, np.uint64)
  return int((int(k[0]) * 1_000_003 + int(k[1]) * 7_919 + index * 104_729) % VOCAB)


def fake_logprob(token: int) -> float:
  return -0.01 * (token + 1)


def expected(r: Request) -> list[int]:
  """The final tokens of `r` (fresh or partial): every index up to the first stop or the
  budget."""
  out = []
  for i in range(r.max_new_tokens):
    t = fake_token(r.key, i)
    out.append(t)
    if t == STOP:
      break
  return out


def make_requests(n: int, *, seed: int = 0, max_new: int = 12, min_version: int = -1,
                  first_id: int = 0) -> list[Request]:
  rng = np.random.default_rng(seed)
  return [Request(first_id + i, rng.integers(1, VOCAB, size=3),
                  int(rng.integers(2, max_new + 1)),
                  rng.integers(0, 2**31, size=2).astype(np.uint32), group_id=first_id + i,
                  min_version=min_version) for i in range(n)]


class FakeWorker:
  """Implements `rollout.workers.Worker` on a manual clock.

  Each exchange is ready `latency` seconds after `send`; it applies aborts (acknowledged),
  weight loads (ready `load_delay` seconds after the command) and submits, then gives each of
  the first `num_slots` held requests up to `tokens_per_exchange` tokens.

  Args:
    die_at: clock time from which the worker is dead (`receive` raises `WorkerLost`).
    hang_at: clock time from which it never answers (tests the heartbeat timeout).
    fail_at: clock time from which its next report is `fatal` (an error in its generation loop,
      as a broken engine reports it), then it is dead.
    load: load each weight version for real (`ref.load()`, checksums verified): a failing
      load is reported in `failed_loads` and the previous version keeps serving.
  """
  synchronous = False

  def __init__(self, worker_id: str, clock: ManualClock, *, num_slots: int = 4,
               tokens_per_exchange: int = 2, latency: float = 0.1, load_delay: float = 0.0,
               die_at: float | None = None, hang_at: float | None = None, local: bool = False,
               fail_at: float | None = None, load: bool = False):
    self.worker_id, self.clock, self.local = worker_id, clock, local
    self.num_slots, self.tpe, self.latency = num_slots, tokens_per_exchange, latency
    self.load_delay, self.die_at, self.hang_at = load_delay, die_at, hang_at
    self.fail_at, self.load = fail_at, load
    self.version, self.loading, self.load_ready = -1, -1, 0.0
    self.held: dict[int, Request] = {}  # in admission order
    self.generated = 0                  # tokens this worker produced (reported or not)
    self.max_waiting = 0                # most requests ever held beyond its slots
    self.versions_served: list[tuple[int, int, int]] = []  # (request id, index, version)
    self.pending: Commands | None = None
    self.ready_at = 0.0
    self.dead = False

  def alive(self) -> bool:
    return not self.dead and (self.die_at is None or self.clock.now() < self.die_at)

  def send(self, commands: Commands) -> None:
    assert self.pending is None, "one exchange at a time"
    self.pending, self.ready_at = commands, self.clock.now() + self.latency

  def receive(self) -> WorkerReport | None:
    if not self.alive():
      self.dead = True
      raise WorkerLost(f"{self.worker_id} died")
    if self.pending is None or self.clock.now() < self.ready_at:
      return None
    if self.hang_at is not None and self.clock.now() >= self.hang_at:
      return None
    cmds, self.pending = self.pending, None
    if self.fail_at is not None and self.clock.now() >= self.fail_at:
      self.die_at = self.clock.now()  # gone after this report
      return WorkerReport(self.worker_id, 0, [], self.version, -1, [], [], self.num_slots,
                          np.zeros((0, 3)), fatal="RuntimeError: scripted engine failure")
    chunks: list[TokenChunk] = []
    loads, failed = [], []
    for rid in cmds.abort:
      self.held.pop(rid, None)
      chunks.append(TokenChunk(rid, -1, np.zeros(0, np.int32), np.zeros(0, np.float32),
                               self.version, FinishReason.ABORTED))
    if cmds.load is not None and self.load:
      try:
        cmds.load.load()
      except Exception as e:  # pylint: disable=broad-except
        failed.append((cmds.load.version, f"{type(e).__name__}: {e}"))
      else:
        self.loading, self.load_ready = cmds.load.version, self.clock.now() + self.load_delay
    elif cmds.load is not None:
      self.loading, self.load_ready = cmds.load.version, self.clock.now() + self.load_delay
    if self.loading >= 0 and self.clock.now() >= self.load_ready:
      loads.append((self.loading, self.load_delay))
      self.version, self.loading = self.loading, -1
    for r in cmds.submit:
      assert r.min_version <= self.version, (r.request_id, r.min_version, self.version)
      self.held[r.request_id] = dataclasses.replace(r)
    self.max_waiting = max(self.max_waiting, len(self.held) - self.num_slots)
    for rid in list(self.held)[:self.num_slots]:
      r = self.held[rid]
      start, toks = r.num_generated, []
      while len(toks) < self.tpe and r.num_generated + len(toks) < r.max_new_tokens:
        toks.append(fake_token(r.key, start + len(toks)))
        self.versions_served.append((rid, start + len(toks) - 1, self.version))
        if toks[-1] == STOP:
          break
      r.extend(toks, [fake_logprob(t) for t in toks], self.version)
      self.generated += len(toks)
      finish = (FinishReason.STOP if toks and toks[-1] == STOP else
                FinishReason.LENGTH if r.remaining == 0 else None)
      chunks.append(TokenChunk(rid, start, np.asarray(toks, np.int32),
                               np.asarray([fake_logprob(t) for t in toks], np.float32),
                               self.version, finish))
      if finish is not None:
        del self.held[rid]
    running = list(self.held)[:self.num_slots]
    return WorkerReport(self.worker_id, 0, chunks, self.version, self.loading, running,
                        list(self.held)[self.num_slots:], self.num_slots,
                        np.zeros((0, 3)), loads=loads, failed_loads=failed)

  def kill(self) -> None:
    self.dead = True

  @classmethod
  def wait_any(cls, workers, timeout: float, clock: ManualClock) -> None:
    now = clock.now()
    ahead = [w.ready_at for w in workers if w.pending is not None and w.ready_at > now]
    clock.set(min(min(ahead, default=now + timeout), now + timeout))

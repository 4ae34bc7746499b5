"""The engine side of the worker protocol (`workers.protocol`): `WorkerServer` applies
`Commands` to an `Engine` and builds `WorkerReport`s.

The in-process worker (`InProcessWorker`, the embedded default) runs it synchronously inside
`receive()`; `workers.thread.ThreadWorker` runs it on a thread of its own (several engines of
this process side by side); the Ray actor (`workers.ray`) runs the same class on a background
thread of another process.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.clock import Clock
from jaxrl_sys.rollout.engine.check import check_weights
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.engine.engine import Engine
from jaxrl_sys.rollout.types import FinishReason, Request, TokenChunk
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerLost, WorkerReport


def _profile(rows: list[tuple[int, int, float]]) -> np.ndarray:
  return np.asarray(rows, np.float64).reshape(-1, 3)


class WorkerServer:
  """The worker side of the protocol: an `Engine` driven by `Commands`.

  Built without weights: the engine is created by the first load. A weight hand-off is
  `load(ref)` (read and check the version), then `loaded(...)` (serve it) or `load_failed(...)`
  (keep the previous one); `apply` runs all three in this thread. `step()` runs one engine
  step and buffers its chunks; `report()` drains everything buffered into a `WorkerReport`.
  Not thread-safe: the Ray actor serialises calls with a lock.

  Args:
    worker_id: the worker's name.
    model_config, engine_config: what the engine is built with.
    warmup: True: compile every engine shape when the first weights arrive, before the worker
      reports a version (ready = compiled: no stall later); "idle": report ready as soon as the
      weights are in, compile the shapes that work needs as it comes, and the others one at a
      time while idle (`warm_when_idle`): a restarted worker serves after the few programs
      its first requests use, not after all of them (preemptible workers, whose life may be
      shorter than a full warm-up); False: compile on first use only.
    token_delay: seconds to sleep per generated token (a slower device, on purpose: tests and
      benchmarks of load balancing and offload on one machine). The step's tokens are released
      one decode position at a time as their share of the delay passes, as a device that slow
      would produce them, and `on_progress` (if set) is called after each release: a worker
      preempted mid-step keeps, through token-level migration, every token produced so far
      instead of losing the whole step (at 0.1 s per token, a step of 32 requests x 4 tokens
      lasts 12.8 s, longer than a worker lives under `--chaos_kill_every=3`).
  """

  def __init__(self, worker_id: str, model_config: ModelConfig, engine_config: EngineConfig,
               warmup: bool | str = False, token_delay: float = 0.0):
    self.worker_id, self.model_config, self.engine_config = worker_id, model_config, engine_config
    self.token_delay = float(token_delay)
    self.on_progress: Callable[[], None] | None = None
    self.engine: Engine | None = None
    if warmup not in (True, False, "idle"):
      raise ValueError(f"WorkerServer: warmup must be True, False or 'idle', got {warmup!r}")
    self._warmup = warmup
    self._warm_done = False
    self._seq = 0
    self._chunks: list[TokenChunk] = []
    self._profile: list[tuple[int, int, float]] = []
    self._loads: list[tuple[int, float]] = []
    self._failed_loads: list[tuple[int, str]] = []
    self._rejected: list[tuple[int, str]] = []
    self.loading = -1
    self.stopped = False

  @property
  def version(self) -> int:
    return -1 if self.engine is None else self.engine.version

  # ----- commands ------------------------------------------------------------------------------
  def apply(self, commands: Commands, *, load: bool = True) -> None:
    """Applies `commands` (abort, then load, then submit). With `load=False` the caller loads
    the weights itself (a background thread: `load`) and calls `loaded` when they arrive."""
    if commands.abort:
      self.abort(commands.abort)
    if commands.load is not None:
      self.loading = int(commands.load.version)
      if load:
        t0 = time.monotonic()
        try:
          params, moe_state = self.load(commands.load)
        except Exception as e:  # pylint: disable=broad-except
          self.load_failed(commands.load.version, e)
        else:
          self.loaded(commands.load.version, params, moe_state, time.monotonic() - t0)
    if commands.submit:
      self.submit(commands.submit)
    if commands.shutdown:
      self.stopped = True

  def exchange(self, commands: Commands) -> WorkerReport:
    """One exchange in this thread: apply `commands`, run one engine step, report."""
    self.apply(commands)
    self.step()
    return self.report()

  def abort(self, request_ids: Sequence[int]) -> None:
    if self.engine is not None:
      self.engine.abort(request_ids)
    # Acknowledge every id: all its token chunks are already buffered before this one.
    for rid in request_ids:
      self._chunks.append(TokenChunk(int(rid), -1, np.zeros((0,), np.int32),
                                     np.zeros((0,), np.float32), self.version,
                                     FinishReason.ABORTED))

  def load(self, ref: Any) -> tuple[Any, Any]:
    """Loads a weight version (`ref.load()`, which verifies its checksums) and checks it fits
    the model; raises `CorruptWeightsError` / `WeightMismatchError` (the caller reports a
    failed load and keeps serving its previous version)."""
    params, moe_state = ref.load()
    check_weights(self.model_config, params, int(ref.version))
    return params, moe_state

  def loaded(self, version: int, params: Any, moe_state: Any, seconds: float) -> None:
    """The load of `version` finished (in `seconds`): serves it from now on (creates the
    engine on the first call)."""
    if self.engine is None:
      engine = Engine(self.model_config, params, self.engine_config, version=version,
                      moe_state=moe_state)
      if self._warmup is True:
        engine.warmup()  # before the engine is visible: the worker reports a version only then
      self.engine = engine
    elif version > self.engine.version:
      self.engine.load(params, version, moe_state)
    self._loads.append((int(version), float(seconds)))
    if self.loading == version:
      self.loading = -1

  def warm_when_idle(self) -> bool:
    """With `warmup="idle"` and no work: compiles one engine shape not compiled yet; returns
    whether it did (False: nothing to do, the caller may sleep)."""
    e = self.engine
    if self._warmup != "idle" or e is None or e.has_work() or self._warm_done:
      return False
    self._warm_done = not e.warmup(limit=1)
    return True

  def load_failed(self, version: int, error: BaseException) -> None:
    """Records a failed load (the previous version keeps serving)."""
    self._failed_loads.append((int(version), f"{type(error).__name__}: {error}"))
    if self.loading == version:
      self.loading = -1

  def submit(self, requests: Sequence[Request]) -> None:
    for r in requests:
      try:
        if self.engine is None:
          raise ValueError(f"worker {self.worker_id} has no weights yet")
        self.engine.submit([r])
      except ValueError as e:
        self._rejected.append((r.request_id, str(e)))
    if self.engine is not None:
      # A resumed request that already ends in a stop token, or has no budget left, finishes at
      # submission: report it like any finish.
      for c in self.engine.take_completions():
        q = c.request
        self._chunks.append(TokenChunk(q.request_id, q.num_generated, np.zeros((0,), np.int32),
                                       np.zeros((0,), np.float32), self.version, c.finish))

  # ----- generation ----------------------------------------------------------------------------
  def has_work(self) -> bool:
    return self.engine is not None and self.engine.has_work()

  def step(self) -> int:
    """One engine step (admission + up to `stream_every` decode steps); returns the number of
    tokens produced. Finished requests' completions stay in their chunks."""
    e = self.engine
    if e is None or not e.has_work():
      return 0
    t0 = time.monotonic()
    chunks = e.step()
    live = e.num_running + sum(c.finish is not None for c in chunks)
    dt = time.monotonic() - t0
    e.take_completions()  # finished requests are reported by their last chunk
    n = sum(len(c.tokens) for c in chunks)
    if self.token_delay and n:
      self._release_slowly(chunks)
      dt = time.monotonic() - t0
    else:
      self._chunks.extend(chunks)
    if n:
      self._profile.append((live, n, dt))
    return n

  def _release_slowly(self, chunks: list[TokenChunk]) -> None:
    """Buffers `chunks` one decode position at a time: sleeps `token_delay` per token of the
    position, then releases those tokens (one-token chunks; a request's finish on its last)."""
    pieces = [c.split() for c in chunks]
    for j in range(max(len(p) for p in pieces)):
      part = [p[j] for p in pieces if len(p) > j]
      time.sleep(self.token_delay * len(part))
      self._chunks.extend(part)
      if self.on_progress is not None:
        self.on_progress()

  def has_news(self) -> bool:
    return bool(self._chunks or self._loads or self._failed_loads or self._rejected)

  def report(self) -> WorkerReport:
    e = self.engine
    running = [] if e is None else [r.request_id for r in e.running_requests()]
    waiting = [] if e is None else e.waiting_ids()
    rep = WorkerReport(self.worker_id, self._seq, self._chunks, self.version, self.loading,
                       running, waiting, self.engine_config.num_slots, _profile(self._profile),
                       self._loads, self._failed_loads, self._rejected, os.getpid())
    self._seq += 1
    self._chunks, self._profile, self._loads, self._rejected = [], [], [], []
    self._failed_loads = []
    return rep


class InProcessWorker:
  """A worker on this process's devices: each exchange applies the commands and runs one
  engine step, synchronously inside `receive()`. The embedded default (rollout shares the
  accelerator with training) and the trainer's seeding engines."""

  synchronous = True

  def __init__(self, worker_id: str, model_config: ModelConfig, engine_config: EngineConfig, *,
               local: bool = True, warmup: bool = False, token_delay: float = 0.0):
    self.worker_id, self.local = worker_id, local
    self.server = WorkerServer(worker_id, model_config, engine_config, warmup=warmup,
                               token_delay=token_delay)
    self._pending: Commands | None = None
    self._dead = False

  def send(self, commands: Commands) -> None:
    if self._pending is not None:
      raise RuntimeError(f"worker {self.worker_id}: an exchange is already outstanding")
    self._pending = commands

  def receive(self) -> WorkerReport | None:
    if self._dead:
      raise WorkerLost(f"worker {self.worker_id} was killed")
    if self._pending is None:
      return None
    commands, self._pending = self._pending, None
    return self.server.exchange(commands)

  def kill(self) -> None:
    self._dead = True

  @property
  def engine(self) -> Engine | None:
    return self.server.engine

  def warmup(self) -> None:
    """Compiles every engine shape now (needs weights loaded)."""
    if self.server.engine is None:
      raise RuntimeError(f"worker {self.worker_id}: warmup needs weights (load a version first)")
    self.server.engine.warmup()

  @classmethod
  def wait_any(cls, workers, timeout: float, clock: Clock) -> None:  # pylint: disable=unused-argument
    return  # an in-process exchange is always ready

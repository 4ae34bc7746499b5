"""The worker protocol: what the rollout manager and a generation engine exchange (plain data).

The manager talks to every worker the same way, whatever runs behind it (an engine in this
process, a Ray actor on another machine, a simulated instance on a virtual clock): one
*exchange* at a time. `send(Commands)` starts an exchange (abort these requests, load this
weight version, start these requests); `receive()` returns its `WorkerReport` once ready (the
tokens streamed since the previous report, the weight version serving, which requests run, a
throughput profile), or raises `WorkerLost`. Commands wait for the next exchange, so there is
never more than one call in flight per worker, and reports arrive in order.

Records are plain data (numpy arrays, ints, strings); weights never travel inside a request:
a `Commands.load` names a version in the weight store (`rollout.weights`) and the worker loads
it itself. This module imports numpy only: the manager and the simulator use it without JAX.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import numpy as np

from jaxrl_sys.rollout.clock import Clock
from jaxrl_sys.rollout.types import Request, TokenChunk


class WorkerLost(RuntimeError):
  """The worker is gone (process killed, actor lost, or silent past the heartbeat timeout)."""


@dataclasses.dataclass
class Commands:
  """What one exchange asks of a worker, applied in this order.

  Attributes:
    abort: request ids to stop. Each is acknowledged by a `TokenChunk` with
      `finish=ABORTED` and no tokens, after every chunk of tokens it produced.
    load: a weight reference (`rollout.weights.WeightRef`) to load and serve from then on;
      running requests continue on the new weights (their KV recomputed when the engine is
      configured with `recompute_kv_on_swap`).
    submit: requests to start or resume (prompt + tokens so far, remaining budget).
    shutdown: stop after this exchange.
  """
  abort: list[int] = dataclasses.field(default_factory=list)
  load: Any = None
  submit: list[Request] = dataclasses.field(default_factory=list)
  shutdown: bool = False

  def empty(self) -> bool:
    return not (self.abort or self.submit or self.shutdown) and self.load is None


@dataclasses.dataclass
class WorkerReport:
  """What a worker reports at the end of one exchange.

  Attributes:
    worker_id: the worker.
    seq: exchange number (0, 1, ...).
    chunks: tokens streamed since the previous report, in generation order; `finish` set on a
      request's last chunk (STOP / LENGTH / CONTEXT), ABORTED acknowledges an abort.
    version: weight version serving now (-1: none loaded yet).
    loading: version being loaded, or -1.
    running / waiting: request ids in decode slots / accepted but not started.
    num_slots: the engine's decode slots.
    profile: `[n, 3]` float64 rows `(live requests, tokens produced, seconds)`, one per decode
      call since the previous report (the throughput-vs-batch profile).
    loads: `(version, seconds)` of weight loads completed since the previous report.
    failed_loads: `(version, message)` of loads that failed (e.g. a checksum mismatch); the
      worker keeps serving its previous version.
    rejected: `(request_id, message)` of requests the worker refused (a bad request).
    pid: the worker's process id.
    fatal: set when the worker broke (an exception in its generation loop); the manager treats
      it as lost and migrates its requests.
  """
  worker_id: str
  seq: int
  chunks: list[TokenChunk]
  version: int
  loading: int
  running: list[int]
  waiting: list[int]
  num_slots: int
  profile: np.ndarray
  loads: list[tuple[int, float]] = dataclasses.field(default_factory=list)
  failed_loads: list[tuple[int, str]] = dataclasses.field(default_factory=list)
  rejected: list[tuple[int, str]] = dataclasses.field(default_factory=list)
  pid: int = 0
  fatal: str | None = None


class Worker(Protocol):
  """A handle on one generation engine, as the manager sees it.

  Attributes:
    worker_id: unique name.
    local: True for a worker on the trainer's own devices (the offload controller's seeding
      engines), False for a remote (e.g. preemptible) one.
    synchronous: True when `receive()` returns the outstanding exchange's report, waiting for
      it (in-process engines: `InProcessWorker` runs the exchange inside `receive()`,
      `ThreadWorker` on a thread of its own): the manager then exchanges only when there is
      work. Asynchronous workers always have one
      exchange outstanding, which doubles as their heartbeat.
  """
  worker_id: str
  local: bool
  synchronous: bool

  def send(self, commands: Commands) -> None:
    """Starts one exchange; at most one may be outstanding."""

  def receive(self) -> WorkerReport | None:
    """The outstanding exchange's report if ready (never blocks long), else None.

    Raises:
      WorkerLost: the worker died; every request it held must be migrated.
    """

  def kill(self) -> None:
    """Stops the worker now, without a goodbye (idempotent)."""

  @classmethod
  def wait_any(cls, workers: Sequence["Worker"], timeout: float, clock: Clock) -> None:
    """Blocks until one of `workers` may have a report ready, or `timeout` seconds pass."""

"""`ThreadWorker`: an in-process worker whose exchanges run on a thread of its own.

Several of them generate side by side on this process's devices. The manager sends every due
exchange before it receives any (`RolloutManager.round`), and `receive()` waits for the
worker's thread, so the reports are taken in worker order whatever thread finishes first: a
run repeats exactly, as with one `InProcessWorker` (the same dispatch, tokens and log-probs
every time), while the engines compute at the same time.

Why: on a CPU host one engine's decode step is a chain of small ops, and XLA keeps about 1.3 of
two cores busy over it (a tiny Qwen3-MoE at 64 sequences). Two engines of 32 slots each on
two threads fill the idle time: the peer workload's rollout went 0.353 -> 0.309 s (MoE) and
0.224 -> 0.183 s (dense). `rollout.setup.local.thread_client` splits the in-process slots
over two of them on CPU hosts when each keeps at least 32 slots.
"""
from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import weakref
from typing import Sequence

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.clock import Clock
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerLost, WorkerReport
from jaxrl_sys.rollout.workers.server import WorkerServer


def _serve(server: WorkerServer, inbox: queue.SimpleQueue, outbox: queue.SimpleQueue,
           first_load: threading.Lock) -> None:
  """The worker's thread: one exchange per `Commands` from `inbox` (None ends it), its report or
  its error to `outbox`."""
  while True:
    commands = inbox.get()
    if commands is None:
      return
    first = server.engine is None and commands.load is not None
    try:
      with first_load if first else contextlib.nullcontext():
        out: WorkerReport | BaseException = server.exchange(commands)
    except BaseException as e:  # pylint: disable=broad-except  # raised by receive()
      out = e
    outbox.put(out)


# Seconds `kill()` (and interpreter exit) waits for a worker's thread to finish its exchange.
JOIN_TIMEOUT = 120.0
_LIVE: "weakref.WeakSet[ThreadWorker]" = weakref.WeakSet()


def _stop(inbox: queue.SimpleQueue, thread: threading.Thread) -> None:
  """Ends a worker's thread and waits for it. The thread must not outlive the interpreter's
  shutdown: a daemon thread still inside XLA (an exchange, or freeing its engine's buffers)
  while the runtime is torn down aborts the process ("terminate called ... FATAL: exception
  not rethrown")."""
  inbox.put(None)
  if thread is not threading.current_thread():
    thread.join(JOIN_TIMEOUT)


class ThreadWorker:
  """Implements `rollout.workers.Worker`: `send()` hands the commands to the worker's thread,
  which applies them and runs one engine step; `receive()` waits for that report (an error in
  the thread is raised there, in the caller's thread, as `InProcessWorker` would raise it).

  Args:
    worker_id, model_config, engine_config, local, warmup, token_delay: as `InProcessWorker`.
    first_load: a lock shared by the workers of one process: the exchange carrying the first
      weight load (building the engine and, with `warmup`, compiling every shape) runs under
      it, so that the second worker finds the programs the first one compiled instead of
      compiling them again.
  """

  synchronous = True

  def __init__(self, worker_id: str, model_config: ModelConfig, engine_config: EngineConfig, *,
               local: bool = True, warmup: bool = False, token_delay: float = 0.0,
               first_load: threading.Lock | None = None):
    self.worker_id, self.local = worker_id, local
    self.server = WorkerServer(worker_id, model_config, engine_config, warmup=warmup,
                               token_delay=token_delay)
    self._inbox: queue.SimpleQueue = queue.SimpleQueue()
    self._outbox: queue.SimpleQueue = queue.SimpleQueue()
    self._outstanding = False
    self._dead = False
    # The thread holds the server and the queues, not this handle: a handle nobody holds any
    # more stops its thread (and frees its engine) without a kill(); at interpreter exit the
    # finalizer (an atexit hook, run before JAX's own) ends and joins the thread.
    self._thread = threading.Thread(target=_serve, name=f"rollout-{worker_id}", daemon=True,
                                    args=(self.server, self._inbox, self._outbox,
                                          first_load or threading.Lock()))
    self._thread.start()
    self._finalizer = weakref.finalize(self, _stop, self._inbox, self._thread)
    _LIVE.add(self)

  def send(self, commands: Commands) -> None:
    if self._outstanding:
      raise RuntimeError(f"worker {self.worker_id}: an exchange is already outstanding")
    if self._dead:
      return  # receive() reports the loss
    self._outstanding = True
    self._inbox.put(commands)

  def receive(self) -> WorkerReport | None:
    if self._dead:
      raise WorkerLost(f"worker {self.worker_id} was killed")
    if not self._outstanding:
      return None
    out = self._outbox.get()
    self._outstanding = False
    if isinstance(out, BaseException):
      raise out
    return out

  def kill(self) -> None:
    """Stops the thread after its current exchange and waits for it (idempotent)."""
    self._dead = True
    self._finalizer()  # runs `_stop` once

  @classmethod
  def wait_any(cls, workers: Sequence["ThreadWorker"], timeout: float, clock: Clock) -> None:  # pylint: disable=unused-argument
    return  # receive() waits for the exchange itself


@atexit.register
def _stop_all() -> None:
  """At interpreter exit, ends every live worker's thread (registered after JAX's own exit
  hooks, since this module imports JAX first, so it runs before them)."""
  for w in list(_LIVE):
    w.kill()

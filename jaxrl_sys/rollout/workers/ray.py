"""Rollout workers as Ray actors (the only module that imports Ray for workers; `pip install -e
.[ray]`).

An actor builds an `Engine` on its own device(s) once it has loaded weights, serves requests and
streams `TokenChunk`s, and may die at any moment (SIGKILL, node preemption). Inside the actor a
generation thread runs the same `WorkerServer` as the in-process worker, back to back; the
manager's `exchange` call only drops commands into an inbox and returns what was produced since
the previous call (waiting up to `max_wait` seconds for news), so a heartbeat is answered even
while the engine compiles or a weight load runs. Weight loads run on a third thread and are
served from the next engine step on.

Manager side, `RayWorker` implements `rollout.workers.Worker`: one `exchange` call in flight;
`ActorDiedError` / `ActorUnavailableError` / `ObjectLostError` become `WorkerLost`. Generation
calls are never retried by Ray (`max_task_retries=0`): the manager migrates instead.
"""
from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.clock import Clock
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerLost, WorkerReport
from jaxrl_sys.rollout.workers.server import WorkerServer

# Environment variables a worker process inherits from the trainer (device faking, platforms).
PASS_ENV = ("JAX_PLATFORMS", "XLA_FLAGS", "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES")


def import_ray():
  """`import ray` with an error that says what to do when it is missing."""
  try:
    import ray  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("Ray rollout workers need Ray: install it with `pip install -e .[ray]` "
                      "(or run with --rollout=local)") from e
  return ray


class RayUnavailableError(ValueError):
  """The Ray cluster named by `--ray_address` cannot be reached (a user-facing setting)."""


def _host_port(address: str) -> tuple[str, int] | None:
  """("host", port) of "host:port" or "ray://host:port"; None for "auto" and other forms."""
  rest = address.split("://", 1)[1] if "://" in address else address
  host, sep, port = rest.rpartition(":")
  if not sep or not host or not port.isdigit():
    return None
  return host.strip("[]"), int(port)


def check_ray_address(address: str, timeout: float = 5.0) -> None:
  """Raises `RayUnavailableError` when nothing accepts connections at `address` within
  `timeout` seconds (Ray itself would retry for minutes without a word)."""
  hp = _host_port(address)
  if hp is None:
    return
  try:
    socket.create_connection(hp, timeout=timeout).close()
  except OSError as e:
    raise RayUnavailableError(
        f"no Ray cluster at --ray_address={address}: {hp[0]}:{hp[1]} does not accept "
        f"connections ({e.strerror or type(e).__name__}, waited up to {timeout:g} s). Start one "
        f"there (`ray start --head --port={hp[1]}`), fix the address, or leave --ray_address "
        "unset to start a local Ray") from None


def init_ray(address: str | None = None, *, num_cpus: int | None = None,
             object_store_memory: int | None = None, connect_timeout: float = 5.0,
             own_session: bool = False) -> None:
  """Connects to a Ray cluster (`address`, e.g. "ray://head:10001", "head:6379" or "auto") or
  starts a local one (default), once per process.

  `own_session`: start the local Ray as a head in its own session (`workers.ray_head`), so a
  signal to the caller's process group (SLURM, Kubernetes, Ctrl-C) does not stop Ray under a
  run that is finishing its step to save; stop it with `shutdown_ray()` (or at exit).

  Raises:
    RayUnavailableError: no cluster answers at `address` (a "host:port" address is probed for
      `connect_timeout` seconds first), or "auto" finds none, or the local head did not start.
  """
  ray = import_ray()
  if ray.is_initialized():
    return
  if address:
    check_ray_address(address, connect_timeout)
  kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                            ignore_reinit_error=True)
  cpus = num_cpus if num_cpus is not None else max(os.cpu_count() or 1, 4)
  memory = object_store_memory or 256 * 2 ** 20
  if address:
    kw["address"] = address
  elif own_session:
    from jaxrl_sys.rollout.workers import ray_head  # pylint: disable=import-outside-toplevel
    try:
      kw["address"] = ray_head.start_head(num_cpus=cpus, object_store_memory=memory)
    except RuntimeError as e:
      raise RayUnavailableError(f"could not start a local Ray: {e}") from None
    kw.pop("include_dashboard")
  else:
    # "local": always a new instance of our own. Without it Ray joins whatever cluster
    # /tmp/ray/ray_current_cluster names (another job's `ray start`, or a stale file left by a
    # killed one) and then refuses `num_cpus`.
    kw["address"] = "local"
    kw["num_cpus"], kw["object_store_memory"] = cpus, memory
  try:
    ray.init(**kw)
  except (ConnectionError, RuntimeError, ValueError) as e:
    raise RayUnavailableError(
        f"could not start or reach Ray ({address or 'local'}): {str(e).strip()}; check "
        "--ray_address, or that `ray start --head` runs on the cluster (leave --ray_address "
        "unset to start a local Ray)") from None


def shutdown_ray() -> None:
  """Disconnects from Ray and stops the local head `init_ray(own_session=True)` started."""
  from jaxrl_sys.rollout.workers import ray_head  # pylint: disable=import-outside-toplevel
  ray = import_ray()
  if ray.is_initialized():
    ray.shutdown()
  ray_head.stop_head()


def _merge(into: WorkerReport | None, rep: WorkerReport) -> WorkerReport:
  """Accumulates `rep` (newer) into the unsent report `into`."""
  if into is None:
    return rep
  rep.chunks = into.chunks + rep.chunks
  rep.profile = np.concatenate([into.profile, rep.profile])
  rep.loads = into.loads + rep.loads
  rep.failed_loads = into.failed_loads + rep.failed_loads
  rep.rejected = into.rejected + rep.rejected
  rep.load_bytes = into.load_bytes + rep.load_bytes
  rep.notes = into.notes + rep.notes
  return rep


class WorkerActor:
  """The actor body (made a Ray actor class by `RayWorker`). See the module docstring."""

  def __init__(self, worker_id: str, model_config: ModelConfig, engine_config: EngineConfig,
               warmup: bool | str = False, token_delay: float = 0.0,
               compile_cache: str | None = None, base_path: str | None = None):
    if compile_cache:
      import jax  # pylint: disable=import-outside-toplevel
      jax.config.update("jax_compilation_cache_dir", compile_cache)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
      jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    self.server = WorkerServer(worker_id, model_config, engine_config, warmup=warmup,
                               token_delay=token_delay, base_path=base_path)
    self._inbox: queue.Queue[Commands] = queue.Queue()
    self._loaded: queue.Queue[tuple[int, Any, Any, float, BaseException | None]] = queue.Queue()
    self._news = threading.Condition()
    self._out: WorkerReport | None = None
    self._seq = 0
    self._wake = threading.Event()
    self._stop = False
    self.server.on_progress = self._publish  # a slow (token_delay) step streams its tokens
    threading.Thread(target=self._loop, name="generate", daemon=True).start()

  def pid(self) -> int:
    return os.getpid()

  def stats(self) -> dict:
    """The engine's counters (`EngineStats`), {} before the first weights."""
    e = self.server.engine
    return {} if e is None else e.stats.as_dict()

  def exchange(self, commands: Commands, max_wait: float) -> WorkerReport:
    """Queues `commands`; returns everything produced since the previous exchange, waiting up
    to `max_wait` seconds for something to report."""
    if not commands.empty():
      self._inbox.put(commands)
      self._wake.set()
    with self._news:
      if self._out is None or not (self._out.chunks or self._out.loads or self._out.failed_loads
                                   or self._out.rejected or self._out.fatal):
        self._news.wait(timeout=max_wait)
      rep, self._out = self._out, None
    if rep is None:
      rep = self._status()
    rep.seq, self._seq = self._seq, self._seq + 1
    return rep

  def _status(self) -> WorkerReport:
    s = self.server
    return WorkerReport(s.worker_id, 0, [], s.version, s.loading, [], [],
                        s.engine_config.num_slots, np.zeros((0, 3)), pid=os.getpid())

  # ----- threads ---------------------------------------------------------------------------------
  def _load(self, ref) -> None:
    t0 = time.monotonic()
    try:
      params, moe_state = self.server.load(ref)
      self._loaded.put((ref.version, params, moe_state, time.monotonic() - t0, None))
    except Exception as e:  # pylint: disable=broad-except
      self._loaded.put((ref.version, None, None, 0.0, e))
    self._wake.set()

  def _publish(self) -> None:
    rep = self.server.report()
    with self._news:
      self._out = _merge(self._out, rep)
      self._news.notify_all()

  def _loop(self) -> None:
    try:
      self._generate()
    except BaseException as e:  # pylint: disable=broad-except
      import traceback  # pylint: disable=import-outside-toplevel
      rep = self._status()
      rep.fatal = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
      with self._news:
        self._out = _merge(self._out, rep)
        self._out.fatal = rep.fatal
        self._news.notify_all()

  def _generate(self) -> None:
    s = self.server
    while not self._stop:
      busy = False
      while not self._inbox.empty():
        cmds = self._inbox.get()
        s.apply(cmds, load=False)
        if cmds.load is not None:
          threading.Thread(target=self._load, args=(cmds.load,), daemon=True).start()
        self._stop |= cmds.shutdown
        busy = True
      while not self._loaded.empty():
        version, params, moe_state, secs, err = self._loaded.get()
        if err is not None:
          s.load_failed(version, err)
        else:
          s.loaded(version, params, moe_state, secs)
        busy = True
      if s.has_work():
        s.step()
        busy = True
      if busy:
        self._publish()
      elif not s.warm_when_idle():
        self._wake.wait(timeout=0.05)
        self._wake.clear()


_ACTOR_CLASSES: dict[tuple, Any] = {}


def _actor_class():
  ray = import_ray()
  if "cls" not in _ACTOR_CLASSES:
    _ACTOR_CLASSES["cls"] = ray.remote(max_restarts=0, max_task_retries=0)(WorkerActor)
  return _ACTOR_CLASSES["cls"]


class RayWorker:
  """A Ray actor as a `rollout.workers.Worker` (manager side).

  Args:
    worker_id: unique name (also the actor's name prefix).
    model_config, engine_config: what the actor's engine is built with.
    local: True for an actor on the trainer's own devices.
    num_cpus, num_gpus, resources: the actor's Ray resources (placement on a cluster).
    warmup: when the engine compiles its shapes (`WorkerServer`'s warmup: True before
      reporting ready, "idle" as work needs them and while idle, False on first use).
    token_delay: seconds the actor sleeps per generated token (slows a worker on purpose, to
      test and benchmark load balancing and the offload controller).
    compile_cache: JAX persistent compilation cache directory for the actor.
    max_wait: seconds an exchange waits in the actor for news (the long poll).
    base_path: LoRA: a Hugging Face directory on the actor's machine holding the base model;
      when its digest is the trainer's, the actor reads the base from there instead of pulling
      it from the weight store (None: load it from the store, once).
  """
  synchronous = False

  def __init__(self, worker_id: str, model_config: ModelConfig, engine_config: EngineConfig, *,
               local: bool = False, num_cpus: float = 1.0, num_gpus: float = 0.0,
               resources: dict | None = None, warmup: bool | str = False, token_delay: float = 0.0,
               compile_cache: str | None = None, max_wait: float = 0.05,
               base_path: str | None = None):
    self.worker_id, self.local, self.max_wait = worker_id, local, max_wait
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    cls = _actor_class()
    self.actor = cls.options(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or {},
                             runtime_env={"env_vars": env}).remote(
        worker_id, model_config, engine_config, warmup, token_delay, compile_cache, base_path)
    self._ref = None
    self._pid: int | None = None
    self.killed = False

  def send(self, commands: Commands) -> None:
    if self._ref is not None:
      raise RuntimeError(f"worker {self.worker_id}: an exchange is already outstanding")
    self._ref = self.actor.exchange.remote(commands, self.max_wait)

  def receive(self) -> WorkerReport | None:
    ray = import_ray()
    if self._ref is None:
      return None
    ready, _ = ray.wait([self._ref], timeout=0)
    if not ready:
      return None
    ref, self._ref = self._ref, None
    try:
      rep = ray.get(ref)
    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
      raise WorkerLost(f"worker {self.worker_id}: {type(e).__name__}") from e
    self._pid = rep.pid
    return rep

  def pid(self, timeout: float = 120.0) -> int:
    """The actor's process id (for tests that SIGKILL it)."""
    if self._pid is None:
      self._pid = int(import_ray().get(self.actor.pid.remote(), timeout=timeout))
    return self._pid

  def stats(self, timeout: float = 60.0) -> dict:
    """The actor's engine counters (`EngineStats.as_dict()`)."""
    return import_ray().get(self.actor.stats.remote(), timeout=timeout)

  def kill(self) -> None:
    """Ends the actor (idempotent; errors of an already dead actor are ignored)."""
    if self.killed:
      return
    self.killed = True
    try:
      import_ray().kill(self.actor, no_restart=True)
    except Exception:  # pylint: disable=broad-except
      pass

  def preempt(self) -> None:
    """SIGKILLs the actor's process, as a spot preemption would (same machine only). Never
    waits: an actor that has not reported its pid yet (still starting) is ended by `kill()`
    (asking it for its pid blocked the manager's tick for up to 30 s per kill)."""
    if self._pid is None:
      self.kill()
      return
    try:
      os.kill(self._pid, signal.SIGKILL)
    except (ProcessLookupError, Exception):  # pylint: disable=broad-except
      self.kill()

  @classmethod
  def wait_any(cls, workers: Sequence["RayWorker"], timeout: float, clock: Clock) -> None:
    refs = [w._ref for w in workers if w._ref is not None]  # pylint: disable=protected-access
    if not refs:
      clock.sleep(timeout)
      return
    import_ray().wait(refs, num_returns=1, timeout=max(timeout, 0.0))

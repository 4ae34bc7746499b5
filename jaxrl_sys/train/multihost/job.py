"""Joining a multi-process JAX job (`jax.distributed`): settings, start-up, a liveness watchdog.

One Python process per host; every process runs the same command. `initialize(config)` must
run before JAX touches a device: it starts the coordination service client (process 0 also
runs the service), selects gloo for cross-process collectives on CPU, and starts a `Watchdog`
that ends this process with an error naming a peer that stopped answering. Start-up is
explicit (`coordinator_address`, `num_processes`, `process_id`) or detected from the
environment by JAX's cluster detection (SLURM, Open MPI, Cloud TPU pod slices, Kubernetes /
GKE), see `detect_cluster`.

This module is host-side start-up only (a side effect); the per-step collectives of the loop
live in `train.multihost.collectives`.
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping

from jaxrl_sys.train.multihost.rendezvous import JoinError, Rendezvous  # noqa: F401

log = logging.getLogger(__name__)

# Exit status of a process that lost a peer (or the coordinator).
EXIT_LOST_PROCESS = 4
_KEY = "jaxrl_sys/alive/"
_DONE, _FAILED = "done", "failed: "
_RESUME = "resume the run with --resume from its last checkpoint, if it saved one (--save_every)"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """How training spreads over devices and processes (the config tree's `distributed`
  section). All of `coordinator_address`, `num_processes`, `process_id` None = detected from
  the cluster environment, else a single process. Only `mesh` is part of what a run computes;
  the others place this launch (left out of config.json, `recipe.config_file.LOCATION_KEYS`):
  a run is the same whatever the number of processes.

  Attributes:
    mesh: device mesh data x model, e.g. 8x4 (faked on CPU when the host has fewer devices;
      with several processes it spans all their devices).
    coordinator_address: multi-process job: process 0's HOST:PORT, the same on every process
      (None: from SLURM / Open MPI / TPU / Kubernetes when detected).
    num_processes: multi-process job: processes in all, one per host (None: detected, else 1).
    process_id: multi-process job: this process's index, 0 .. num_processes-1 (None:
      detected).
    local_device_ids: multi-process job: this process's local accelerators, comma-separated,
      e.g. 0,1 (None: all; one per task under SLURM / Open MPI on GPUs).
    timeout: multi-process job: seconds after which a silent process counts as lost; the
      others then exit (status 4) naming it. Also JAX's heartbeat and start-up timeout.
  """
  mesh: str = "1x1"
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: str | None = None
  timeout: float = 120.0

  def __post_init__(self):
    if self.num_processes is not None and self.num_processes < 1:
      raise ValueError(f"distributed.num_processes={self.num_processes} must be >= 1")
    if self.process_id is not None and self.num_processes is not None and not (
        0 <= self.process_id < self.num_processes):
      raise ValueError(f"distributed.process_id={self.process_id} must lie in [0, "
                       f"distributed.num_processes={self.num_processes})")
    if not self.timeout > 0 or self.timeout == float("inf"):
      raise ValueError(f"distributed.timeout={self.timeout} must be a finite number of "
                       "seconds > 0")
    if self.coordinator_address is not None:
      coordinator_host_port(self.coordinator_address)  # validates
    parse_device_ids(self.local_device_ids)  # validates
    explicit = (self.coordinator_address, self.num_processes, self.process_id)
    if (self.num_processes or 1) > 1 and None in explicit and detect_cluster() is None:
      raise ValueError(
          f"distributed.num_processes={self.num_processes} needs "
          "distributed.coordinator_address=HOST:PORT (process 0's address, the same on every "
          "process) and distributed.process_id=I (0 .. num_processes-1) on each process, "
          "unless SLURM, Open MPI, a TPU pod slice or Kubernetes provides them")

  @property
  def explicit(self) -> bool:
    """True when the flags ask for more than one process."""
    return (self.num_processes or 1) > 1

  @property
  def device_ids(self) -> tuple[int, ...] | None:
    """`local_device_ids` as integers ("0,1" -> (0, 1); None = all)."""
    return parse_device_ids(self.local_device_ids)


def coordinator_host_port(address: str) -> tuple[str, int]:
  """("host", port) of "host:port" (also "[ipv6]:port").

  Raises:
    ValueError: no port, or a port that is not a number in 1..65535.
  """
  host, sep, port = str(address).rpartition(":")
  host = host.strip("[]")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"distributed.coordinator_address={address!r}: expected HOST:PORT, the "
                     "address and a free port of process 0 (e.g. localhost:12355), the same on "
                     "every process")
  return host, int(port)


def parse_device_ids(text: str | None) -> tuple[int, ...] | None:
  """"0,1" -> (0, 1); None / "" -> None."""
  if not text:
    return None
  try:
    return tuple(int(p) for p in str(text).split(",") if p.strip())
  except ValueError as e:
    raise ValueError(f"distributed.local_device_ids={text!r}: expected comma-separated integers, "
                     "e.g. 0,1") from e


def detect_cluster() -> tuple[str, int] | None:
  """(environment name, process count) when JAX's cluster detection recognises where this
  runs (SLURM, Open MPI, Cloud TPU, GKE / Kubernetes), else None. Uses JAX's detector classes
  (a private module; None when they moved) and never contacts a coordinator."""
  try:
    from jax._src import clusters  # pylint: disable=import-outside-toplevel
    envs = [e for e in clusters.ClusterEnv._cluster_types  # pylint: disable=protected-access
            if not getattr(e, "opt_in_only_method", False)]
    for env in envs:
      if env.is_env_present():
        return getattr(env, "name", env.__name__) or env.__name__, int(env.get_process_count())
  except Exception as e:  # pylint: disable=broad-except
    log.debug("cluster detection failed: %s", e)
  return None


def planned_process_count(config: DistributedConfig) -> int:
  """The process count the job will have (before `initialize`): the flag, else the detected
  environment's, else 1."""
  if config.num_processes is not None:
    return config.num_processes
  found = detect_cluster()
  return found[1] if found else 1


def _set_cpu_collectives() -> None:
  import jax  # pylint: disable=import-outside-toplevel
  try:  # gloo: CPU collectives across processes (the option may be gone once it is default)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except (AttributeError, ValueError, KeyError) as e:
    log.debug("jax_cpu_collectives_implementation not set: %s", e)


def initialize(config: DistributedConfig, *, watchdog: bool = True,
               settings: Mapping[str, Any] | None = None) -> "Watchdog | None":
  """Joins the job when the flags or the environment ask for several processes (else does
  nothing and returns None). Must run before any JAX computation.

  With an explicit job (`coordinator_address`, `num_processes`, `process_id`), every process
  first joins the side channel (`multihost.rendezvous`): the processes' `settings` are compared
  and a process that does not join within `config.timeout` is named, before JAX starts; the
  channel then reports a lost process (any rank) the moment its connection closes.

  Returns:
    The started `Watchdog` (None for a single process or `watchdog=False`).

  Raises:
    ValueError: the coordinator cannot be reached within `config.timeout` (the message names
      the address and what to check), or the processes' settings differ (naming them).
    rendezvous.JoinError: a process did not join, or process 0 did not answer, in time.
  """
  if not config.explicit and config.coordinator_address is None:
    found = detect_cluster()
    if found is None or found[1] <= 1:
      return None
  side = None
  if config.explicit and config.coordinator_address and config.process_id is not None:
    side = Rendezvous(config.coordinator_address, config.process_id, config.num_processes,
                      settings or {}, timeout=config.timeout)
    try:
      side.join()
    except BaseException:
      side.close()
      raise
  import jax  # pylint: disable=import-outside-toplevel
  _set_cpu_collectives()
  timeout = max(int(round(config.timeout)), 1)
  kwargs = dict(coordinator_address=config.coordinator_address,
                num_processes=config.num_processes, process_id=config.process_id,
                local_device_ids=list(config.device_ids) if config.device_ids else None,
                initialization_timeout=timeout, heartbeat_timeout_seconds=timeout)
  # Newer JAX releases may drop or rename the timeout arguments: pass what this one takes.
  accepted = inspect.signature(jax.distributed.initialize).parameters
  kwargs = {k: v for k, v in kwargs.items() if k in accepted}
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"could not join the distributed job (coordinator {config.coordinator_address or 'auto'}"
        f", process {config.process_id} of {config.num_processes}) within --distributed_timeout="
        f"{config.timeout:g} s: {type(e).__name__}: {str(e)[:300]}. Check that every process "
        "was started with the same --coordinator_address and --num_processes and a distinct "
        "--process_id, and that process 0's port is reachable") from e
  if not watchdog or jax.process_count() == 1:
    return None
  dog = Watchdog(jax.process_index(), jax.process_count(), config.timeout, side=side)
  dog.start()
  return dog


def _client():
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  return distributed.global_state.client


def _default_exit(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  os._exit(EXIT_LOST_PROCESS)  # pylint: disable=protected-access


class Watchdog:
  """Peer liveness through the coordination service's key-value store.

  Every `timeout / 8` s each process writes an increasing counter under its own key and reads
  every peer's; a peer whose counter has not moved for `timeout / 2` s, or a coordinator that
  no longer answers, is reported by `on_lost(message)` (default: print it and `os._exit` with
  `EXIT_LOST_PROCESS`, since a collective waiting on the lost peer would never return). The
  message names the lost process. `lost()` returns the message once a loss is known (the loop
  uses it to explain a failed collective).

  Args:
    index, count: this process's index and the job's process count.
    timeout: the --distributed_timeout, seconds.
    client: the coordination client (default: jax.distributed's).
    clock: seconds, monotonic (injected for tests).
    on_lost: called once with the message.
  """

  def __init__(self, index: int, count: int, timeout: float, *, client=None,
               clock: Callable[[], float] = time.monotonic,
               on_lost: Callable[[str], None] = _default_exit, side: Rendezvous | None = None):
    self.index, self.count, self.timeout = index, count, float(timeout)
    self.side = side  # the side channel: a peer's closed connection is a loss at once
    self._client = client if client is not None else _client()
    self.clock, self.on_lost = clock, on_lost
    self._beat = 0
    self._seen: dict[int, tuple[str, float]] = {}
    self._lost: str | None = None
    self._halt = threading.Event()
    self._thread = threading.Thread(target=self._run, name="jaxrl-watchdog", daemon=True)

  def start(self) -> None:
    self.tick()
    self._thread.start()
    if self.side is not None:
      self.side.watch(self._report)

  def stop(self) -> None:
    self._halt.set()

  def finish(self, error: str | None = None) -> None:
    """Tells the peers this process ends: cleanly (its silence is then no loss), or with
    `error` (they stop at once with a message quoting it). Stops the heartbeats."""
    self._halt.set()
    if self.side is not None:
      self.side.finish(error)
    try:
      value = _DONE if error is None else _FAILED + error[:300]
      self._client.key_value_set(f"{_KEY}{self.index}", value, allow_overwrite=True)
    except Exception as e:  # pylint: disable=broad-except
      log.debug("watchdog: could not publish the end of process %d: %s", self.index, e)

  def lost(self, wait: float = 0.0) -> str | None:
    """The loss message, waiting up to `wait` s for the watchdog to decide."""
    end = self.clock() + wait
    while self._lost is None and self.clock() < end and not self._halt.is_set():
      time.sleep(0.05)
    return self._lost

  def tick(self) -> str | None:
    """One heartbeat: publish ours, check the peers'. Returns the loss message, if any."""
    now = self.clock()
    try:
      self._beat += 1
      self._client.key_value_set(f"{_KEY}{self.index}", str(self._beat), allow_overwrite=True)
      for peer in range(self.count):
        if peer == self.index:
          continue
        value = self._try_get(f"{_KEY}{peer}")
        if value == _DONE:
          continue
        if value.startswith(_FAILED):
          return self._report(f"process {peer} of {self.count} failed: "
                              f"{value[len(_FAILED):]}; process {self.index} stops too")
        last = self._seen.get(peer)
        if last is None or value != last[0]:
          self._seen[peer] = (value, now)
        elif now - last[1] > self.timeout / 2:
          return self._report(
              f"lost process {peer} of {self.count}: no heartbeat for {now - last[1]:.0f} s "
              f"(--distributed_timeout={self.timeout:g}); it died or hangs. Process "
              f"{self.index} stops too; {_RESUME}")
    except Exception as e:  # pylint: disable=broad-except
      if self._halt.is_set():
        return None
      return self._report(
          f"lost the coordinator (process 0 of {self.count}) or its connection: "
          f"{type(e).__name__}: {str(e)[:200]}. Process {self.index} stops too; {_RESUME}")
    return None

  def _try_get(self, key: str) -> str:
    try:
      return self._client.key_value_try_get(key)
    except Exception as e:  # pylint: disable=broad-except
      if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
        return ""  # not started yet: its first beat starts its clock
      raise

  def _report(self, message: str) -> str:
    if self._lost is None:
      self._lost = message
      self.on_lost(message)
    return message

  def _run(self) -> None:
    period = max(self.timeout / 8, 0.05)
    while not self._halt.wait(period):
      if self.tick() is not None:
        return

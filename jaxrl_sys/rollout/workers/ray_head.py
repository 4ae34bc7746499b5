"""A local Ray head in its own session, so the trainer's signals are the trainer's alone.

`ray.init()` starts Ray's processes (GCS, raylet, then the worker actors) as children in the
caller's process group. A signal sent to that group (SLURM and Kubernetes send SIGTERM to the
whole job, a shell's Ctrl-C SIGINT) then stops Ray at the moment the trainer is asked to finish
its step and save: the step waits on a Ray that is gone (a minute, until Ray's own "failed to
connect to GCS") and no checkpoint is written.

`start_head()` runs `ray start --head --block` in a new session (`setsid`): the signal reaches
the trainer only, which finishes its step with Ray up, saves, and stops the head on its way out
(`stop_head`, also at interpreter exit). The head dies with the trainer even when the trainer is
SIGKILLed: it gets SIGTERM when its parent dies (Linux `PR_SET_PDEATHSIG`), and `ray start
--block` fate-shares its daemons (and they their actors) with itself.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The helper that arms the parent-death signal, then becomes `ray start` (the signal survives
# exec). argv: the trainer's pid, then the ray command line.
_LAUNCH = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "  sys.exit(0)  # the trainer died before the signal was armed\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n")

_HEAD: dict = {}  # "proc": the `ray start` process, "address": its GCS address


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def head_address() -> str | None:
  """The address of the head this process started, while it runs (else None)."""
  proc = _HEAD.get("proc")
  return _HEAD["address"] if proc is not None and proc.poll() is None else None


def start_head(*, num_cpus: int, object_store_memory: int, timeout: float = 60.0) -> str:
  """Starts (or reuses) this process's local Ray head in its own session; returns its address.

  Raises:
    RuntimeError: `ray start` exited, or its GCS did not accept connections within `timeout`
      seconds (the message holds the end of its output).
  """
  address = head_address()
  if address is not None:
    return address
  port = _free_port()
  ray_exe = os.path.join(os.path.dirname(sys.executable), "ray")
  if not os.path.exists(ray_exe):
    raise RuntimeError(f"the Ray command line ({ray_exe}) is not installed beside Python")
  # A private temp dir: `ray start` records its address as the machine's "current cluster"
  # there, which a plain `ray.init()` anywhere on the machine would otherwise join (and fail
  # on once this head is gone).
  temp_dir = tempfile.mkdtemp(prefix="jaxrl_ray_")
  cmd = [ray_exe, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         f"--num-cpus={num_cpus}", f"--object-store-memory={object_store_memory}",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
  # Its output goes to a file (a pipe nobody reads could fill and block it). No token
  # authentication (`ray start` turns it on; `ray.init()`'s local instance has none): the
  # driver in this process connects as to the instance `ray.init()` would have started.
  # The head is ours alone: a RAY_ADDRESS inherited from a parent that runs its own Ray (a
  # notebook, a test harness) must not reach its raylet and workers, whose actors would then
  # register with that other cluster and be cancelled.
  # Its authentication is the driver's: none, unless this process inherited RAY_AUTH_MODE (a
  # parent that ran `ray.init()` exports RAY_AUTH_MODE=token to its children; Ray reads it when
  # it is imported, and a driver in token mode has every actor creation on a head without
  # authentication cancelled).
  env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
  env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"))
  log = tempfile.TemporaryFile()  # pylint: disable=consider-using-with
  proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(os.getpid()), *cmd],
                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True, env=env)
  _HEAD.update(proc=proc, address=f"127.0.0.1:{port}", log=log, temp_dir=temp_dir)
  atexit.register(_disconnect_and_stop)
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      log.seek(0)
      err = log.read().decode(errors="replace")[-1500:]
      stop_head()
      raise RuntimeError(f"`ray start --head` exited with status {proc.returncode}: {err}")
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
      return _HEAD["address"]
    except OSError:
      time.sleep(0.2)
  stop_head()
  raise RuntimeError(f"the local Ray head did not accept connections on port {port} within "
                     f"{timeout:g} s")


def _disconnect_and_stop() -> None:
  """At exit: the driver leaves Ray, then the head stops. Ray's own exit hook (registered when
  `ray` is imported, so it runs after this one) would otherwise find the head gone and wait a
  minute for its GCS before ending the process with status 1 (a run refused with exit 2 right
  after Ray started exited 1, 60 s later)."""
  ray = sys.modules.get("ray")
  try:
    if ray is not None and ray.is_initialized():
      ray.shutdown()
  finally:
    stop_head()


def stop_head(grace: float = 10.0) -> None:
  """Stops the head this process started and everything in its session (Ray's daemons and the
  worker actors): SIGTERM, then SIGKILL after `grace` seconds. A no-op without one."""
  proc, log, temp_dir = _HEAD.pop("proc", None), _HEAD.pop("log", None), _HEAD.pop("temp_dir",
                                                                                   None)
  _HEAD.clear()
  if log is not None:
    log.close()
  if proc is None:
    return
  try:
    pgid = os.getpgid(proc.pid)
  except ProcessLookupError:
    pgid = None
  for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
    if pgid is None:
      break
    try:
      os.killpg(pgid, sig)
    except ProcessLookupError:
      break
    try:
      proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
      continue
    # the session may still hold Ray's children for a moment after `ray start` exits
    try:
      os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    break
  if temp_dir is not None:
    shutil.rmtree(temp_dir, ignore_errors=True)

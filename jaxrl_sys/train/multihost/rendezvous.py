"""The job's side channel: one TCP connection from each process to process 0, before JAX starts.

JAX's coordination service checks neither that every process runs the same settings nor, in a
way a user can read, that they are all there: a process missing at start-up, or process 0 lost
mid-run, ends the others with a C++ check failure and a native stack (exit 134), and a process
started with another `--learning_rate` trains its own copy of the parameters without a word.

`Rendezvous` opens a plain TCP connection from every process to process 0 on the coordinator's
port + 1 (`side_address`) before `jax.distributed.initialize`:

* start-up: each process sends its id and its resolved settings; process 0 checks the ids and
  compares the settings, and every process stops with the same one-line error naming the
  differing settings (exit 2) or the process that did not join within the timeout (exit 4);
* liveness: the connections stay open for the run. A process that dies closes its end at once
  (the kernel does it, even for SIGKILL), so its peers notice within milliseconds, not after a
  heartbeat timeout, and stop with one line naming it (exit 4, `job.EXIT_LOST_PROCESS`); process
  0 relays a loss it sees to the others. A process that ends (or fails) says so first, so its
  silence is no loss.

Host-side only; numpy-free and JAX-free.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable, Mapping


class JoinError(RuntimeError):
  """A process of the job did not join, or could not reach process 0, in time."""


def side_address(coordinator_address: str) -> tuple[str, int]:
  """(host, port) of the side channel: the coordinator's host, its port + 1."""
  host, _, port = coordinator_address.rpartition(":")
  return host.strip("[]"), int(port) + 1


def settings_difference(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
  """"name: A (process 0) vs B (process i)" for each setting that differs."""
  out = []
  for key in sorted(set(mine) | set(theirs)):
    if mine.get(key) != theirs.get(key):
      out.append(f"{key} {theirs.get(key)!r} vs {mine.get(key)!r}")
  return out


def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
  sock.sendall((json.dumps(message) + "\n").encode())


class _Lines:
  """Newline-delimited JSON messages from one socket."""

  def __init__(self, sock: socket.socket):
    self.sock, self.buf = sock, b""

  def read(self, timeout: float | None) -> dict | None:
    """The next message; None at end of stream (the peer closed); TimeoutError past `timeout`."""
    while b"\n" not in self.buf:
      try:
        self.sock.settimeout(timeout)
        chunk = self.sock.recv(65536)
      except socket.timeout as e:
        raise TimeoutError from e
      except OSError:
        return None
      if not chunk:
        return None
      self.buf += chunk
    line, self.buf = self.buf.split(b"\n", 1)
    try:
      return json.loads(line)
    except ValueError:
      return None


class Rendezvous:
  """The side channel of one process (see the module docstring).

  Args:
    address: the coordinator's HOST:PORT (the channel uses PORT + 1).
    index, count: this process's id and the job's process count.
    settings: this process's resolved settings (JSON values), compared with process 0's.
    timeout: seconds to wait for every process to join.
  """

  def __init__(self, address: str, index: int, count: int, settings: Mapping[str, Any], *,
               timeout: float):
    self.host, self.port = side_address(address)
    self.index, self.count, self.timeout = index, count, float(timeout)
    self.settings = dict(settings)
    self._peers: dict[int, tuple[socket.socket, _Lines]] = {}
    self._server: socket.socket | None = None
    self._ended = threading.Event()
    self._lock = threading.Lock()
    self._on_lost: Callable[[str], None] | None = None

  # ----- start-up ----------------------------------------------------------------------------
  def join(self) -> None:
    """Connects every process (process 0 accepts, the others connect) and compares settings.

    Raises:
      ValueError: the processes' settings differ (the message names each differing setting),
        or two processes have one id.
      JoinError: a process did not join (process 0), or process 0 did not answer, within the
        timeout.
    """
    if self.index == 0:
      self._accept_all()
    else:
      self._connect()

  def _accept_all(self) -> None:
    deadline = time.monotonic() + self.timeout
    try:
      server = socket.create_server(("", self.port), reuse_port=False)
    except OSError as e:
      raise JoinError(f"process 0 cannot listen on port {self.port} (the coordinator's port + "
                      f"1, the job's side channel): {e.strerror or e}; choose another "
                      "--coordinator_address port") from None
    self._server = server
    hellos: dict[int, dict] = {}
    while len(hellos) < self.count - 1:
      left = deadline - time.monotonic()
      if left <= 0:
        missing = [i for i in range(1, self.count) if i not in hellos]
        who = (f"process {missing[0]}" if len(missing) == 1 else
               f"processes {', '.join(map(str, missing))}")
        raise JoinError(
            f"{who} of {self.count} did not join within "
            f"distributed.timeout={self.timeout:g} s (not started, or they cannot reach "
            f"{self.host}:{self.port}); start every process with the same "
            "--coordinator_address and --num_processes and its own --process_id")
      server.settimeout(left)
      try:
        sock, _ = server.accept()
      except socket.timeout:
        continue
      lines = _Lines(sock)
      try:
        hello = lines.read(max(deadline - time.monotonic(), 1.0))
      except TimeoutError:
        hello = None
      if not hello or "process_id" not in hello:
        sock.close()
        continue
      pid = int(hello["process_id"])
      if pid in hellos or pid == 0 or not 0 < pid < self.count:
        problem = (f"two processes were started with --process_id={pid}" if pid in hellos or
                   pid == 0 else f"--process_id={pid} is not in [0, {self.count})")
        self._fail_all(problem, extra=[sock])
        raise ValueError(problem)
      hellos[pid] = hello
      self._peers[pid] = (sock, lines)
    problems = []
    for pid in sorted(hellos):
      diff = settings_difference(self.settings, hellos[pid].get("settings", {}))
      if diff:
        problems.append(f"process {pid} differs from process 0 in {', '.join(diff)}")
    if problems:
      message = ("the processes of the job were started with different settings (every process "
                 "must run the same command but for --process_id): " + "; ".join(problems))
      self._fail_all(message)
      raise ValueError(message)
    for sock, _ in self._peers.values():
      _send(sock, {"ok": True})

  def _fail_all(self, message: str, extra=()) -> None:
    for sock in [s for s, _ in self._peers.values()] + list(extra):
      try:
        _send(sock, {"error": message})
      except OSError:
        pass

  def _connect(self) -> None:
    deadline = time.monotonic() + self.timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
      try:
        sock = socket.create_connection((self.host, self.port), timeout=2.0)
        break
      except OSError as e:
        last = e
        time.sleep(0.2)
    else:
      raise JoinError(
          f"process 0 (the coordinator) at {self.host}:{self.port} did not answer within "
          f"distributed.timeout={self.timeout:g} s ({getattr(last, 'strerror', None) or last}): "
          "it is not started, or not reachable from here; start it with the same "
          "--coordinator_address and --num_processes") from None
    lines = _Lines(sock)
    _send(sock, {"process_id": self.index, "settings": self.settings})
    try:
      reply = lines.read(max(deadline - time.monotonic(), 1.0) + self.timeout)
    except TimeoutError:
      reply = None
    if reply is None:
      sock.close()
      raise JoinError(f"process 0 (the coordinator) at {self.host}:{self.port} did not confirm "
                      f"the job within distributed.timeout={self.timeout:g} s (another process "
                      "missing, or process 0 stopped)")
    if "error" in reply:
      sock.close()
      raise ValueError(reply["error"])
    self._peers[0] = (sock, lines)

  # ----- liveness ------------------------------------------------------------------------------
  def watch(self, on_lost: Callable[[str], None]) -> None:
    """Starts one thread per connection that calls `on_lost(message)` when the peer closes its
    end without having said it ended (or says it failed, or relays another process's loss)."""
    self._on_lost = on_lost
    for pid, (_, lines) in self._peers.items():
      threading.Thread(target=self._watch_one, args=(pid, lines), daemon=True,
                       name=f"jaxrl-side-{pid}").start()

  def _watch_one(self, pid: int, lines: _Lines) -> None:
    while True:
      msg = lines.read(None)
      if self._ended.is_set():
        return
      if msg is None:
        who = (f"process {pid} of {self.count}" if pid else
               f"process 0 of {self.count} (the coordinator)")
        self._lost(f"lost {who}: its connection closed (killed, crashed, or its host went "
                   f"down). Process {self.index} stops too; resume the run with --resume from "
                   "its last checkpoint, if it saved one (--save_every)")
        return
      if msg.get("done"):
        return  # ended cleanly: its coming silence is no loss
      if "lost" in msg or "failed" in msg:
        text = msg.get("lost") or (f"process {pid} of {self.count} failed: {msg['failed']}; "
                                   f"process {self.index} stops too")
        self._lost(text)
        return

  def _lost(self, message: str) -> None:
    with self._lock:
      if self._ended.is_set():
        return
      self._ended.set()
    if self.index == 0:  # tell the others which process it was, before this one exits
      for pid, (sock, _) in self._peers.items():
        try:
          _send(sock, {"lost": message.replace(f"Process {self.index} stops",
                                               "The others stop")})
        except OSError:
          pass
    if self._on_lost is not None:
      self._on_lost(message)

  def finish(self, error: str | None = None) -> None:
    """Tells the peers this process ends (cleanly, or with `error`); stops watching."""
    with self._lock:
      if self._ended.is_set():
        return
      self._ended.set()
    for sock, _ in self._peers.values():
      try:
        _send(sock, {"done": True} if error is None else {"failed": error[:300]})
      except OSError:
        pass

  def close(self) -> None:
    self.finish()
    for sock, _ in self._peers.values():
      try:
        sock.close()
      except OSError:
        pass
    if self._server is not None:
      self._server.close()

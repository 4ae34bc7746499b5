"""Ownership of a run directory: a lock file naming the process that writes into it.

A run holds `<run_dir>/.lock` (JSON: pid, host, start time, the process's kernel start tick)
from before it touches the directory until it ends. Another run that wants the directory
(`--overwrite` deletes its outputs, `--resume` appends to them, a new run fills it) is refused
with an error naming the owner while the owner lives. A lock left behind by a process that no
longer exists (SIGKILL, a crashed machine on the same host) is stale: it is reclaimed with a
message. A lock written on another host cannot be checked from here; it is refused, and the
message says how to remove it by hand once that job is known to be gone.

The lock file is created atomically (written to a temporary name, then hard-linked to `.lock`,
which fails when one exists), so two runs starting at once cannot both win.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Callable

LOCK_NAME = ".lock"


class RunDirLockedError(ValueError):
  """The run directory belongs to a running job (the message names its pid and host)."""


def _proc_start_tick(pid: int) -> int | None:
  """The kernel start time of `pid` in clock ticks since boot (Linux), or None. Tells a live
  owner from an unrelated process that reused its pid."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      text = f.read()
    return int(text.rsplit(")", 1)[1].split()[19])
  except (OSError, ValueError, IndexError):
    return None


def _alive(pid: int, tick: int | None) -> bool:
  """Whether process `pid` (on this host) exists and is the one that wrote the lock."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    return True
  if tick is not None:
    now = _proc_start_tick(pid)
    if now is not None and now != tick:
      return False  # the pid was reused by a newer process
  # A zombie (exited, not yet reaped by its parent) no longer writes anything.
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return True


def describe(owner: dict) -> str:
  started = owner.get("started")
  when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(
      started, (int, float)) else "?"
  return f"pid {owner.get('pid')} on host {owner.get('host')!r}, started {when}"


class RunLock:
  """The lock of one run directory (see the module docstring).

  Args:
    run_dir: the directory (must exist).
    message: where "reclaimed a stale lock" lines go (default: nowhere).
  """

  def __init__(self, run_dir: str, message: Callable[[str], None] | None = None):
    self.path = os.path.join(run_dir, LOCK_NAME)
    self.message = message or (lambda text: None)
    self.held = False
    self.me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
               "proc_start": _proc_start_tick(os.getpid())}

  def owner(self) -> dict | None:
    """The lock file's contents, {} for an unreadable one, None when there is no lock."""
    try:
      with open(self.path, encoding="utf-8") as f:
        data = json.load(f)
      return data if isinstance(data, dict) else {}
    except FileNotFoundError:
      return None
    except (OSError, ValueError):
      return {}

  def acquire(self, flag: str = "--out_dir") -> None:
    """Takes the lock, reclaiming a stale one.

    Raises:
      RunDirLockedError: a live process (or one on another host) holds it.
    """
    for _ in range(3):
      if self._try_create():
        self.held = True
        return
      owner = self.owner()
      if owner is None:  # released between our attempt and the read
        continue
      if owner == {}:
        raise RunDirLockedError(
            f"{flag}={os.path.dirname(self.path)} has an unreadable lock file {self.path}; if no "
            "other run uses this directory, delete that file and start again")
      if owner.get("host") != self.me["host"]:
        raise RunDirLockedError(
            f"{flag}={os.path.dirname(self.path)} is in use by the run of {describe(owner)} "
            f"(another host: it cannot be checked from here). If that job is gone, delete "
            f"{self.path}; otherwise choose another {flag}")
      pid = owner.get("pid")
      if isinstance(pid, int) and (pid == os.getpid() or _alive(pid, owner.get("proc_start"))):
        raise RunDirLockedError(
            f"{flag}={os.path.dirname(self.path)} is in use by the running job of "
            f"{describe(owner)}: its outputs are not touched (neither --overwrite nor --resume "
            f"act on a live run); wait for it to end, stop it (kill -TERM {pid}), or choose "
            f"another {flag}")
      self.message(f"reclaimed a stale lock of {flag}={os.path.dirname(self.path)}: the run "
                   f"of {describe(owner)} no longer exists")
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass
    raise RunDirLockedError(f"could not take the lock {self.path} (other runs keep taking it)")

  def _try_create(self) -> bool:
    tmp = f"{self.path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(self.me, f)
    try:
      os.link(tmp, self.path)
      return True
    except FileExistsError:
      return False
    except OSError:  # a file system without hard links: exclusive create, then write
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(self.me, f)
      return True
    finally:
      os.remove(tmp)

  def release(self) -> None:
    """Removes the lock if this process holds it."""
    if not self.held:
      return
    self.held = False
    owner = self.owner()
    if owner and owner.get("pid") == self.me["pid"] and owner.get("started") == self.me["started"]:
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass

  def __enter__(self) -> "RunLock":
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()

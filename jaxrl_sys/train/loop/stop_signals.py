"""How a run stops on signals: SIGTERM, SIGHUP (the terminal closed, e.g. a dropped SSH
session) and SIGINT (Ctrl-C) ask it to finish the step and save; a second SIGINT aborts at the
next safe point; a third exits the process at once. After SIGHUP the run's terminal output goes
to /dev/null (writing to a hung-up terminal fails, which would end the run before its save).

The handlers never raise into the code they interrupt: an exception raised by a signal handler
inside orbax's or JAX's waits can leave a lock held or a checkpoint half-written (and the
process hung on it). The loop calls `check()` at safe points (a poll, a micro-batch, a step
boundary) and wraps orbax work in `critical()`; `check()` raises `RunInterrupted` once a
second SIGINT came, never inside a critical block, so the save in flight is finished first.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable


# The signals that stop a run gracefully (SIGHUP: a closed terminal, as SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _detach_from_terminal() -> None:
  """Points stdout and stderr at /dev/null where they are a terminal (one that hung up)."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    for fd in (1, 2):
      try:
        if os.isatty(fd):
          os.dup2(devnull, fd)
      except OSError:
        pass
  finally:
    os.close(devnull)


class RunInterrupted(KeyboardInterrupt):
  """A second SIGINT: the run stopped at once (the checkpoint save in flight was flushed)."""


class StopSignals:
  """The stop state of one run, and its SIGTERM / SIGHUP / SIGINT handlers.

  Args:
    message: prints a line for the user (the run's `Progress.message`).
  """

  def __init__(self, message: Callable[[str], None]):
    self.message = message
    self.stop = threading.Event()
    self.name: str | None = None  # the signal that asked to stop
    self.abort: str | None = None  # set by a second SIGINT
    self._critical = 0
    self._depth = 0
    self._old: dict | None = None

  def install(self) -> None:
    """Installs the handlers (main thread only; elsewhere `request_stop` is the way). Calls
    nest: the handlers stay until the outermost `restore`."""
    self._depth += 1
    if self._depth == 1 and threading.current_thread() is threading.main_thread():
      self._old = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}

  def restore(self) -> None:
    self._depth = max(self._depth - 1, 0)
    if (self._depth == 0 and self._old is not None
        and threading.current_thread() is threading.main_thread()):
      for s, h in self._old.items():
        signal.signal(s, h)
      self._old = None

  @contextlib.contextmanager
  def installed(self):
    """The handlers installed for the block (e.g. a run and the closing of what it used, so
    that a Ctrl-C while the rollout workers shut down is the run's second SIGINT, not a
    KeyboardInterrupt anywhere)."""
    self.install()
    try:
      yield self
    finally:
      self.restore()

  def _handle(self, signum, frame) -> None:  # pylint: disable=unused-argument
    name = signal.Signals(signum).name
    if signum == signal.SIGHUP:
      _detach_from_terminal()
    if signum == signal.SIGINT and self.abort:
      os.write(2, b"third SIGINT: exiting now, without waiting for the checkpoint save\n")
      os._exit(130)  # pylint: disable=protected-access
    if signum == signal.SIGINT and self.stop.is_set():
      self.abort = f"second {name}: stopped at once"
      self.message(f"second {name}: stopping now, once the checkpoint save in flight is "
                   "written (Ctrl-C again to exit without waiting)")
      return
    self.name = self.name or name
    again = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
    self.message(f"{name}: finishing the current step, then saving and exiting{again}")
    self.stop.set()

  def check(self) -> None:
    """A safe point: raises `RunInterrupted` after a second SIGINT (outside `critical`)."""
    if self.abort and not self._critical:
      raise RunInterrupted(self.abort)

  @contextlib.contextmanager
  def critical(self):
    """Marks work an abort must not interrupt (orbax saves and waits); checks on leaving."""
    self._critical += 1
    try:
      yield
    finally:
      self._critical -= 1
    self.check()

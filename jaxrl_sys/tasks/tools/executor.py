"""`ToolExecutor`: runs tool calls in a bounded pool, with time limits, output limits and counts.

At most `workers` calls run at once (`--tool_workers`); the others wait in submission order.
A call runs on a thread of its own (the default), or, for a `Tool(sandbox=True)`, in a child
process (`sandbox_child.py`) with a CPU-time limit, an address-space limit and the wall-time
limit, killed (with its process group) when it runs past the latter.

A call past its time limit (`Tool.timeout`, else `--tool_timeout`) resolves at once as a
`timeout` result and frees its place in the pool: a child process is killed; a thread cannot be
killed, so it is abandoned (it finishes, or not, on its own, its result discarded, counted in
`threads_abandoned`): run code that may hang in the sandbox. Output longer than
`max_output_chars` is cut (with a note saying how much), bytes that are not UTF-8 are replaced.
Nothing here raises on a tool's behaviour: every outcome is a `ToolResult` (`tools.base`).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

from jaxrl_sys.tasks.tools.base import ToolCall, ToolResult, Tool, call_tool_fn

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Limits of a sandboxed call's child process.

  Attributes:
    cpu_seconds: CPU time (RLIMIT_CPU); the child is killed by the kernel past it.
    memory_mb: address space (RLIMIT_AS) in MiB; allocations beyond it fail (MemoryError).
  """
  cpu_seconds: float = 10.0
  memory_mb: int = 1024

  def __post_init__(self):
    if not self.cpu_seconds > 0 or self.memory_mb < 64:
      raise ValueError(f"SandboxLimits: cpu_seconds must be > 0 and memory_mb >= 64, got "
                       f"{self.cpu_seconds}, {self.memory_mb}")


def clean_output(raw: Any, limit: int) -> tuple[str, bool, bool]:
  """A tool's return value as observation text: `(text, truncated, bad_utf8)`.

  `bytes` are decoded as UTF-8 (invalid bytes replaced by U+FFFD: `bad_utf8`); dicts and lists
  become JSON, anything else `str()`; text longer than `limit` characters is cut and ends with
  a note giving the length."""
  bad = False
  if isinstance(raw, (bytes, bytearray)):
    try:
      text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
      text, bad = bytes(raw).decode("utf-8", "replace"), True
  elif isinstance(raw, str):
    text = raw
    try:
      text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
      text, bad = text.encode("utf-8", "replace").decode("utf-8"), True
  elif isinstance(raw, (dict, list)):
    text = json.dumps(raw, ensure_ascii=False)
  else:
    text = str(raw)
  if len(text) > limit:
    return text[:limit] + f"\n[output truncated: {len(text)} characters, limit {limit}]", True, bad
  return text, False, bad


class _Call:
  """One submitted call and its settlement (exactly once, by whichever comes first)."""

  def __init__(self, tool: Tool | None, call: ToolCall, future: cf.Future):
    self.tool, self.call, self.future = tool, call, future
    self.lock = threading.Lock()
    self.settled = False
    self.started = 0.0
    self.proc: subprocess.Popen | None = None


class ToolExecutor:
  """A bounded pool for tool calls (see the module docstring).

  Args:
    workers: calls running at once (`--tool_workers`).
    timeout: seconds a call may run (`--tool_timeout`), unless its tool sets its own.
    max_output_chars: observation characters kept per call.
    sandbox: limits of sandboxed calls' child processes.
  """

  def __init__(self, workers: int = 8, timeout: float = 30.0, max_output_chars: int = 8192,
               sandbox: SandboxLimits = SandboxLimits()):
    if workers < 1 or not timeout > 0 or max_output_chars < 64:
      raise ValueError(f"ToolExecutor: workers >= 1, timeout > 0 and max_output_chars >= 64 "
                       f"needed, got {workers}, {timeout}, {max_output_chars}")
    self.workers, self.timeout, self.max_output_chars = workers, float(timeout), max_output_chars
    self.sandbox = sandbox
    self._slots = threading.Semaphore(workers)
    self._queue: collections.deque[_Call] = collections.deque()
    self._wake = threading.Condition()
    self._closed = False
    self._lock = threading.Lock()
    self.counts: collections.Counter[str] = collections.Counter()
    self.seconds = 0.0
    self._dispatcher = threading.Thread(target=self._dispatch, name="tool-dispatch", daemon=True)
    self._dispatcher.start()

  # ----- submission ----------------------------------------------------------------------------
  def submit(self, tool: Tool | None, call: ToolCall) -> cf.Future:
    """Starts `call` on `tool` (None: an unknown tool, answered at once); returns a future of
    its `ToolResult` (never an exception)."""
    fut: cf.Future = cf.Future()
    if tool is None:
      self._settle_now(fut, ToolResult(call.name, f"error: unknown tool {call.name!r}",
                                       "unknown"))
      return fut
    if self._closed:
      raise RuntimeError("ToolExecutor is closed")
    with self._wake:
      self._queue.append(_Call(tool, call, fut))
      self._wake.notify()
    return fut

  def run(self, tools: Mapping[str, Tool], calls: Sequence[ToolCall]) -> list[ToolResult]:
    """Runs `calls` (at the same time, within the pool's bound) and waits for every result."""
    futs = [self.submit(tools.get(c.name), c) for c in calls]
    return [f.result() for f in futs]

  def count(self, status: str, n: int = 1) -> None:
    """Adds to a counter (parsers' problems are counted here too)."""
    with self._lock:
      self.counts[status] += n

  def metrics(self) -> dict[str, float]:
    """Cumulative counts: `tool_calls`, `tool_<status>` per status, `tool_truncated`,
    `tool_bad_utf8`, `tool_threads_abandoned`, and `tool_seconds` (summed wall time)."""
    with self._lock:
      out = {f"tool_{k}": float(v) for k, v in self.counts.items()}
      out["tool_seconds"] = self.seconds
    return out

  def close(self) -> None:
    """Stops taking calls; queued calls are answered as errors, running children killed."""
    with self._wake:
      self._closed = True
      left, self._queue = list(self._queue), collections.deque()
      self._wake.notify_all()
    for c in left:
      self._settle(c, ToolResult(c.call.name, "error: the tool executor was closed", "error"))

  # ----- execution -----------------------------------------------------------------------------
  def _dispatch(self) -> None:
    while True:
      with self._wake:
        while not self._queue and not self._closed:
          self._wake.wait()
        if self._closed:
          return
        c = self._queue.popleft()
      self._slots.acquire()
      c.started = time.monotonic()
      limit = c.tool.timeout or self.timeout
      timer = threading.Timer(limit, self._on_timeout, (c, limit))
      timer.daemon = True
      target = self._run_sandboxed if c.tool.sandbox else self._run_thread
      threading.Thread(target=target, args=(c, timer), name=f"tool-{c.tool.name}",
                       daemon=True).start()
      timer.start()

  def _run_thread(self, c: _Call, timer: threading.Timer) -> None:
    try:
      raw = call_tool_fn(c.tool.fn, c.call.arguments)
    except BaseException as e:  # pylint: disable=broad-except
      res = ToolResult(c.tool.name, f"error: tool {c.tool.name} raised {type(e).__name__}: {e}",
                       "error")
    else:
      text, cut, bad = clean_output(raw, self.max_output_chars)
      res = ToolResult(c.tool.name, text, "ok", truncated=cut, bad_utf8=bad)
    timer.cancel()
    self._settle(c, res)

  def _run_sandboxed(self, c: _Call, timer: threading.Timer) -> None:
    lim = self.sandbox
    req = json.dumps({"ref": c.tool.ref, "arguments": c.call.arguments, "sys_path": sys.path,
                      "cpu_seconds": lim.cpu_seconds, "memory_mb": lim.memory_mb})
    try:
      proc = subprocess.Popen([sys.executable, "-S", _CHILD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    except OSError as e:
      timer.cancel()
      self._settle(c, ToolResult(c.tool.name, f"error: could not start the sandbox: {e}",
                                 "error"))
      return
    with c.lock:
      c.proc = proc
      settled = c.settled
    if settled:  # timed out before the child existed
      _kill(proc)
    out, err = proc.communicate(req.encode("utf-8"))
    timer.cancel()
    rc, msg = proc.returncode, err.decode("utf-8", "replace").strip().splitlines()
    detail = next((m[6:] for m in reversed(msg) if m.startswith("ERROR ")), "")
    if rc == 0:
      text, cut, bad = clean_output(out, self.max_output_chars)
      res = ToolResult(c.tool.name, text, "ok", truncated=cut, bad_utf8=bad)
    elif rc == 3:
      res = ToolResult(c.tool.name, f"error: tool {c.tool.name} raised {detail}", "error")
    elif rc == 4:
      res = ToolResult(c.tool.name, f"error: tool {c.tool.name} ran out of memory (limit "
                       f"{lim.memory_mb} MiB)", "killed")
    else:
      why = _signal_name(-rc) if rc < 0 else f"exit status {rc}"
      res = ToolResult(c.tool.name, f"error: tool {c.tool.name} was killed ({why}; limits "
                       f"{lim.cpu_seconds:g} CPU s, {lim.memory_mb} MiB)", "killed")
    self._settle(c, res)

  def _on_timeout(self, c: _Call, limit: float) -> None:
    with c.lock:
      proc = c.proc
    if proc is not None:
      _kill(proc)
    elif not c.tool.sandbox:
      self.count("threads_abandoned")
    self._settle(c, ToolResult(c.tool.name, f"error: tool {c.tool.name} timed out after "
                               f"{limit:g} s", "timeout"))

  def _settle(self, c: _Call, res: ToolResult) -> None:
    with c.lock:
      if c.settled:
        return
      c.settled = True
    seconds = time.monotonic() - c.started if c.started else 0.0
    res = dataclasses.replace(res, seconds=seconds)
    with self._lock:
      self.seconds += seconds
    if c.started:
      self._slots.release()
    self._settle_now(c.future, res)

  def _settle_now(self, fut: cf.Future, res: ToolResult) -> None:
    with self._lock:
      self.counts["calls"] += 1
      self.counts[res.status] += 1
      self.counts["truncated"] += int(res.truncated)
      self.counts["bad_utf8"] += int(res.bad_utf8)
    fut.set_result(res)


def _kill(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _signal_name(num: int) -> str:
  try:
    return signal.Signals(num).name
  except ValueError:
    return f"signal {num}"


def wait_all(futures: Iterable[cf.Future]) -> list[ToolResult]:
  """The results of `futures`, in order."""
  return [f.result() for f in futures]

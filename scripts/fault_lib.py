"""Shared by the fault cases (`scripts/fault_cases.py`, `scripts/fault_cases_rollout.py`) and the
probe (`scripts/probe_lib.py`): running the CLI and Python snippets under a time limit, the
verdicts, and reading a run's metrics rows, checkpoints and TensorBoard purge markers."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = ["--prompts_per_step=4", "--group_size=4", "--micro_batch_groups=16", "--sft_steps=0",
          "--lr_warmup_steps=0", "--max_new_tokens=4", "--progress=false",
          f"--compile_cache={os.path.join(REPO, '.jax_cache')}"]


def _env() -> dict:
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")
  # the test suite's XLA flags: compile-cache entries are keyed on them
  env["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0")
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


@dataclasses.dataclass
class Result:
  rc: int | None
  err: str
  seconds: float
  timed_out: bool = False


class Scratch:
  """A base of the case classes: `tmp` holds their files, `d(name)` is a path in it."""

  def __init__(self, tmp: str):
    self.tmp = tmp

  def d(self, name: str) -> str:
    return os.path.join(self.tmp, name)


def run_argv(argv: list[str], *, timeout: float = 240, env: dict | None = None,
             cwd: str = REPO, act: Callable | None = None, session: bool = True,
             merge_stdout: bool = False) -> Result:
  """Runs `argv` under a time limit; `act(proc)` (optional) acts on it while it runs; `env`
  adds environment variables. `session` starts it in its own process group (a group signal then
  reaches it and its children, as SLURM sends one), and whatever ends this call (the time limit,
  an exception in `act`) first kills that group, so no trainer or Ray process it started
  outlives the case. `Result.err` holds stderr, or stdout and stderr with `merge_stdout`."""
  t0 = time.monotonic()
  p = subprocess.Popen(argv, cwd=cwd, env=dict(_env(), **(env or {})),
                       stdout=subprocess.PIPE if merge_stdout else subprocess.DEVNULL,
                       stderr=subprocess.STDOUT if merge_stdout else subprocess.PIPE,
                       text=True, start_new_session=session)
  pick = (lambda out, err: out) if merge_stdout else (lambda out, err: err)
  try:
    if act is not None:
      act(p)
    text = pick(*p.communicate(timeout=timeout))
    return Result(p.returncode, text, time.monotonic() - t0)
  except subprocess.TimeoutExpired:
    kill_tree(p)
    text = pick(*p.communicate())
    return Result(None, text, time.monotonic() - t0, timed_out=True)
  finally:
    kill_tree(p)


def cli(args: list[str], timeout: float = 240, signals: Callable | None = None,
        env: dict | None = None) -> Result:
  """Runs the CLI in its own process group (`run_argv`); `signals(proc)` (optional) acts on
  the running process; `env` adds environment variables."""
  return run_argv([sys.executable, "-m", "experiments.grpo", *SHAPES, *args], timeout=timeout,
                  env=env, act=signals)


def kill_tree(p: subprocess.Popen) -> None:
  """SIGKILLs `p`'s process group when `p` leads one (`start_new_session`), else `p` alone, if
  anything is left; then reaps `p`."""
  try:
    if os.getpgid(p.pid) == p.pid:
      os.killpg(p.pid, signal.SIGKILL)
    elif p.poll() is None:
      p.kill()
  except (ProcessLookupError, PermissionError):
    pass
  if p.poll() is None:
    p.wait()


def py(code: str, timeout: float = 60) -> Result:
  t0 = time.monotonic()
  try:
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=timeout)
    return Result(p.returncode, p.stdout + p.stderr, time.monotonic() - t0)
  except subprocess.TimeoutExpired as e:
    return Result(None, str(e.stderr or ""), time.monotonic() - t0, timed_out=True)


def verdict_of(r: Result, ok: bool, *, error: str | None = None, lost: bool = False) -> str:
  """The verdict: hang / traceback first, then `lost`, then the expected outcome: a clear
  error containing `error` (exit 2) when given, else `ok`."""
  if r.timed_out:
    return "hang"
  if "Traceback (most recent call last)" in r.err:
    return "traceback"
  if lost:
    return "data lost"
  if error is not None:
    lines = [s for s in r.err.splitlines() if s.startswith("error:")]
    if r.rc == 2 and lines and re.search(error, r.err) and len(r.err) < 4000:
      return "clear error"
    return "silent wrong"
  return "ok" if ok else "silent wrong"


def _rows(out: str) -> list[int]:
  path = os.path.join(out, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  return [json.loads(s)["step"] for s in open(path, encoding="utf-8") if s.strip()]


def _ckpts(out: str) -> list[int]:
  d = os.path.join(out, "checkpoints")
  if not os.path.isdir(d):
    return []
  return sorted(int(s) for s in os.listdir(d) if s.isdigit()
                and os.path.exists(os.path.join(d, s, "_CHECKPOINT_METADATA")))


def _free_port() -> int:
  """A local TCP port nothing listens on (bound, then released)."""
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _tb_purges(tb_dir: str) -> list[int]:
  """The steps of TensorBoard's purge markers (SessionLog START events) in `tb_dir`'s event
  files, read as TFRecords (length, crc, payload, crc)."""
  from tensorboardX.proto.event_pb2 import Event, SessionLog  # pylint: disable=import-outside-toplevel
  out = []
  for name in sorted(os.listdir(tb_dir)) if os.path.isdir(tb_dir) else []:
    data = open(os.path.join(tb_dir, name), "rb").read()
    i = 0
    while i + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      ev = Event.FromString(data[i + 12:i + 12 + n])
      i += 16 + n
      if ev.HasField("session_log") and ev.session_log.status == SessionLog.START:
        out.append(ev.step)
  return out


def _wait(pred, p, timeout=180) -> bool:
  t0 = time.monotonic()
  while time.monotonic() - t0 < timeout and p.poll() is None:
    if pred():
      return True
    time.sleep(0.05)
  return False

"""Shared by the probe's case modules (`scripts/probe_cases.py` runs them): running the CLI and
Python snippets under a time limit, the verdicts, a real full disk, and the base of the case
classes (their scratch files, the data, the tiny Hugging Face models)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=wrong-import-position
from fault_lib import (REPO, SHAPES, Result, _ckpts, _env, _free_port,  # noqa: E402,F401
                       Scratch, _rows, _wait, run_argv)

GRPO = [sys.executable, "-m", "experiments.grpo"]
SIM = [sys.executable, "-m", "experiments.spot_sim", "--preset=qwen3-8b", "--settings=rlboost",
       "--max_steps=2", "--jobs=1", "--noplots"]
TB = "Traceback (most recent call last)"


# ----- running things -----------------------------------------------------------------------------
def run(argv: list[str], *, timeout: float = 240, env: dict | None = None, cwd: str = REPO,
        act: Callable | None = None, session: bool = False) -> Result:
  """Runs `argv` (`fault_lib.run_argv`, stdout and stderr together); `act(proc)` acts on it
  while it runs; `session` starts it in its own process group (a process-group signal then
  reaches it and its children, as SLURM sends one)."""
  return run_argv(argv, timeout=timeout, env=env, cwd=cwd, act=act, session=session,
                  merge_stdout=True)


def grpo(args: list[str], steps: int | None = 2, **kw) -> Result:
  """The training CLI with the fast shapes (and --steps unless the case gives it)."""
  given = any(a.startswith(("--steps", "--loop.steps")) for a in args)
  extra = [f"--steps={steps}"] if steps is not None and not given else []
  return run([*GRPO, *SHAPES, *extra, *args], **kw)


def py(code: str, timeout: float = 120) -> Result:
  return run([sys.executable, "-c", code], timeout=timeout)


def verdict(r: Result, ok: bool = False, *, error: str | None = None, codes=(2,),
            lost: bool = False) -> str:
  """hang / traceback / data lost first; then, with `error`, a clear error is exit code in
  `codes` with an `error:` (or absl `FATAL Flags parsing error`) line matching `error`."""
  if r.timed_out:
    return "hang"
  if TB in r.err or "Fatal Python error" in r.err or "Check failure" in r.err:
    return "traceback"
  if lost:
    return "data lost"
  lines = [s for s in r.err.splitlines() if s.startswith(("error:", "FATAL Flags parsing"))]
  if error is not None:
    if r.rc in codes and lines and re.search(error, r.err, flags=re.S):
      return "clear error"
    return "silent wrong"
  if ok:
    return "ok"
  # refused where it should have worked, but clearly (the probe's verdict for such refusals)
  return "clear error" if r.rc in (1, 2) and lines else "silent wrong"


def first_error(r: Result) -> str:
  line = next((s for s in r.err.splitlines() if s.startswith(("error:", "FATAL"))), "")
  return f"rc {r.rc} in {r.seconds:.0f} s: {line[:140]}"


def metrics(out: str) -> list[dict]:
  path = os.path.join(out, "metrics.jsonl")
  return [json.loads(s) for s in open(path, encoding="utf-8") if s.strip()] if os.path.exists(
      path) else []


def can_mount() -> bool:
  return os.geteuid() == 0 and shutil.which("mount") is not None


class Tmpfs:
  """A small tmpfs at `path` (a real full disk)."""

  def __init__(self, path: str, size: str = "450k"):
    self.path, self.size = path, size

  def __enter__(self):
    os.makedirs(self.path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", self.path],
                   check=True)
    return self.path

  def __exit__(self, *exc):
    subprocess.run(["umount", "-l", self.path], check=False)


# ----- the cases ---------------------------------------------------------------------------------
class ProbeBase(Scratch):
  """The case classes' base: each `case_*` method of a subclass returns (verdict, detail);
  its docstring is "ID area: title"."""

  RAY = ["--rollout=ray", "--num_workers=2", "--sft_steps=5"]

  def __init__(self, tmp: str):
    super().__init__(tmp)
    self._sums = None
    self._hf = None

  def write(self, name: str, text: str | bytes) -> str:
    path = self.d(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(text, bytes) else "w") as f:
      f.write(text)
    return path

  @property
  def sums(self) -> str:
    if self._sums is None:
      rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
      self._sums = self.write("sums.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return self._sums

  def hf(self) -> tuple[str, str]:
    """(tiny float32 HF model dir, its bfloat16 re-save)."""
    if self._hf is None:
      tiny, bf16 = self.d("tiny"), self.d("tiny-bf16")
      code = (f"from tests.train.common import bf16_hf_dir\n"
              f"from examples.make_tiny_hf_model import main\nmain({tiny!r})\n"
              f"bf16_hf_dir({bf16!r})\n")
      r = py(code, timeout=300)
      if r.rc != 0:
        raise RuntimeError(r.err[-2000:])
      self._hf = (tiny, bf16)
    return self._hf

  def reward(self, name: str, body: str) -> str:
    return self.write(f"{name}.py", "import math, sys, time\n"
                      f"def score(prompt, completion, answer, **row):\n{body}\n") + ":score"

  def config(self, name: str, text: str) -> str:
    return self.write(f"{name}.yaml", text)

  def _error_case(self, args, error, codes=(2,), **kw):
    r = grpo(args, **kw)
    return verdict(r, error=error, codes=codes), first_error(r)

  def _ok_run(self, name, args, check=None, **kw):
    out = self.d(name)
    r = grpo([*args, f"--out_dir={out}"], **kw)
    rows = _rows(out)
    ok = r.rc == 0 and bool(rows) and (check is None or check(out, r))
    return verdict(r, ok), f"rc {r.rc} in {r.seconds:.0f} s, rows {rows[-3:]}"


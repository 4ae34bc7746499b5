"""Reruns issue 44's probe (143 fault and bad-input cases, N1-N143) and the first-use journeys'
findings (J1-...) and counts the verdicts.

    PYTHONPATH=$PWD .venv/bin/python scripts/probe_cases.py [--only ID[,ID...]] [--skip ...]
        [--json OUT.json]

Each case runs the CLI (`python -m experiments.grpo` / `experiments.spot_sim`, subprocesses with
real signals, real full disks (a small tmpfs: root only), real multi-process jobs and Ray) or a
few lines of Python, under a time limit, and gets one verdict (`scripts/fault_cases.py`'s):
ok, clear error, silent wrong, traceback, data lost, hang, or skipped (with the reason). An
expected error must name the problem: a refusal whose text does not match is "silent wrong"
(a misleading message). Areas: config, dtypes, outputs, locks, processes, stores, ray, rewards,
data, sim, signals, losses, journeys (`--only` takes ids or area names; `--skip` too).

Not run by CI: about 40 minutes on 2 busy CPU cores. Run it under the machine's heavy-job lock.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=wrong-import-position
from fault_cases import REPO, SHAPES, Result, _ckpts, _env, _free_port, _rows, _wait  # noqa: E402

GRPO = [sys.executable, "-m", "experiments.grpo"]
SIM = [sys.executable, "-m", "experiments.spot_sim", "--preset=qwen3-8b", "--settings=rlboost",
       "--max_steps=2", "--jobs=1", "--noplots"]
TB = "Traceback (most recent call last)"


# ----- running things -----------------------------------------------------------------------------
def run(argv: list[str], *, timeout: float = 240, env: dict | None = None, cwd: str = REPO,
        act: Callable | None = None, session: bool = False) -> Result:
  """Runs `argv`; `act(proc)` acts on it while it runs; `session` starts it in its own process
  group (a process-group signal then reaches it and its children, as SLURM sends one)."""
  t0 = time.monotonic()
  full_env = dict(_env(), **(env or {}))
  p = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, start_new_session=session)
  if act is not None:
    act(p)
  try:
    out, _ = p.communicate(timeout=timeout)
    return Result(p.returncode, out, time.monotonic() - t0)
  except subprocess.TimeoutExpired:
    _kill_tree(p)
    out, _ = p.communicate()
    return Result(None, out, time.monotonic() - t0, timed_out=True)


def _kill_tree(p: subprocess.Popen) -> None:
  try:
    os.killpg(os.getpgid(p.pid), signal.SIGKILL) if _own_group(p) else p.kill()
  except ProcessLookupError:
    pass


def _own_group(p) -> bool:
  try:
    return os.getpgid(p.pid) == p.pid
  except ProcessLookupError:
    return False


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
class Probe:
  """Each `case_*` method returns (verdict, detail); its docstring is "ID area: title"."""

  def __init__(self, tmp: str):
    self.tmp = tmp
    self._sums = None
    self._hf = None

  def d(self, name: str) -> str:
    return os.path.join(self.tmp, name)

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

  # ---- config -------------------------------------------------------------------------------
  def case_n1(self):
    """N1 config: --config nested tree loop: {steps: 2, prompts_per_step: 8}"""
    c = self.config("n1", "loop:\n  steps: 2\n  prompts_per_step: 8\n")
    return self._ok_run("n1", [f"--config={c}"], steps=None,
                        check=lambda o, r: _rows(o) == [1, 2])

  def case_n2(self):
    """N2 config: nested typo loop: {stepz: 2}"""
    return self._error_case(["--config=" + self.config('n2', 'loop:\n  stepz: 2\n')],
                            r"did you mean 'loop\.steps'")

  def case_n3(self):
    """N3 config: unknown section lop: {steps: 2}"""
    return self._error_case(["--config=" + self.config('n3', 'lop:\n  steps: 2\n')],
                            r"unknown key.*'lop'")

  def case_n4(self):
    """N4 config: --loop.stepz=2"""
    return self._error_case(["--loop.stepz=2"], r"loop\.steps", codes=(1, 2))

  def case_n5(self):
    """N5 config: --loop.steps=abc"""
    return self._error_case(["--loop.steps=abc"], r"abc", codes=(1, 2))

  def case_n6(self):
    """N6 config: config loop: {steps: "2"} (a quoted number)"""
    c = self.config("n6", 'loop:\n  steps: "2"\n')
    return self._ok_run("n6", [f"--config={c}"], steps=None, check=lambda o, r: _rows(o) == [1, 2])

  def case_n7(self):
    """N7 config: config with steps: 2 and loop: {steps: 3}"""
    return self._error_case(["--config=" + self.config('n7', 'steps: 2\nloop:\n  steps: 3\n')],
                            r"loop\.steps is given twice")

  def case_n8(self):
    """N8 config: --steps=2 --loop.steps=3 (one setting under two names)"""
    out = self.d("n8")
    r = grpo(["--steps=2", "--loop.steps=3", f"--out_dir={out}"], steps=None)
    if r.rc == 0:
      return "silent wrong", f"rc 0: trained {len(_rows(out))} steps, no warning"
    return verdict(r, error=r"(--steps|loop\.steps).*(twice|two names|both)"), first_error(r)

  def case_n9(self):
    """N9 config: config loop: 5 (a scalar where a section belongs)"""
    return self._error_case(["--config=" + self.config('n9', 'loop: 5\n')],
                            r"'loop' is a section")

  def case_n10(self):
    """N10 config: dotted keys loop.steps: 2"""
    c = self.config("n10", "loop.steps: 2\n")
    return self._ok_run("n10", [f"--config={c}"], steps=None, check=lambda o, r: _rows(o) == [1, 2])

  def case_n11(self):
    """N11 config: config loop: {steps: null}"""
    return self._error_case(["--config=" + self.config('n11', 'loop:\n  steps: null\n')],
                            r"loop\.steps.*(null|needs a value)", steps=None)

  def case_n12(self):
    """N12 config: config loop: {steps: {value: 2}}"""
    return self._error_case(["--config=" + self.config('n12', 'loop:\n  steps:\n    value: 2\n')],
                            r"bad value .* for 'loop\.steps'", steps=None)

  def case_n13(self):
    """N13 config: config output: {out_dir: X}"""
    out = self.d("n13")
    c = self.config("n13", f"output:\n  out_dir: {out}\n")
    r = grpo([f"--config={c}"])
    return verdict(r, r.rc == 0 and _rows(out) == [1, 2]), f"rc {r.rc}, rows {_rows(out)}"

  def case_n14(self):
    """N14 config: config output: {resume: true} (resume is not a setting)"""
    return self._error_case(["--config=" + self.config('n14', 'output:\n  resume: true\n')],
                            r"unknown key.*output\.resume")

  def case_n15(self):
    """N15 config: --config=<a directory>"""
    os.makedirs(self.d("n15dir"), exist_ok=True)
    return self._error_case([f"--config={self.d('n15dir')}"], r"n15dir")

  def case_n16(self):
    """N16 config: a config file with a history: [1, 2] key"""
    c = self.config("n16", "history: [1, 2]\nloop:\n  steps: 2\n")
    return self._ok_run("n16", [f"--config={c}"], steps=None)

  # ---- dtypes -------------------------------------------------------------------------------
  def case_n17(self):
    """N17 dtypes: --param_dtype=float16"""
    return self._error_case(["--param_dtype=float16"], r"use one of")

  def case_n18(self):
    """N18 dtypes: --param_dtype=int8"""
    return self._error_case(["--param_dtype=int8"], r"use one of")

  def case_n19(self):
    """N19 dtypes: --param_dtype=bf16 (short name)"""
    return self._error_case(["--param_dtype=bf16"], r"use one of")

  def case_n20(self):
    """N20 dtypes: --compute_dtype=float64"""
    return self._error_case(["--compute_dtype=float64"], r"use one of")

  def case_n21(self):
    """N21 dtypes: --rollout_dtype=float16"""
    return self._error_case(["--rollout_dtype=float16"], r"use one of")

  def case_n22(self):
    """N22 dtypes: --export_dtype=int8 --export_hf=..."""
    return self._error_case(["--export_dtype=int8", f"--export_hf={self.d('n22hf')}"],
                            r"use one of")

  def case_n23(self):
    """N23 dtypes: --behav_weight_cap=0 / -1 / nan"""
    got = [grpo([f"--behav_weight_cap={v}"]) for v in ("0", "-1", "nan")]
    verdicts = [verdict(r, error=r"must be > 0") for r in got]
    worst = next((v for v in verdicts if v != "clear error"), "clear error")
    return worst, "; ".join(first_error(r)[:60] for r in got)

  def case_n24(self):
    """N24 dtypes: --behav_weight_cap=inf, then --config of its config.json"""
    out = self.d("n24")
    r = grpo(["--behav_weight_cap=inf", f"--out_dir={out}"])
    r2 = grpo([f"--config={out}/config.json", f"--out_dir={self.d('n24b')}"], steps=None)
    return verdict(r, r.rc == 0 and r2.rc == 0), f"rc {r.rc}, again from config.json rc {r2.rc}"

  def case_n25(self):
    """N25 dtypes: --behav_weight_cap=1"""
    return self._ok_run("n25", ["--behav_weight_cap=1"])

  def case_n26(self):
    """N26 dtypes: --behav_weight_cap=abc"""
    return self._error_case(["--behav_weight_cap=abc"], r"abc", codes=(1, 2))

  def case_n27(self):
    """N27 dtypes: --model=<bf16 HF> --export_hf (transformers loads it)"""
    _, bf16 = self.hf()
    out, hf = self.d("n27"), self.d("n27hf")
    r = grpo([f"--model={bf16}", f"--task=jsonl:{self.sums}", f"--out_dir={out}",
              f"--export_hf={hf}"])
    load = py("import transformers, sys\n"
              f"transformers.AutoModelForCausalLM.from_pretrained({hf!r})\nprint('loaded')")
    return verdict(r, r.rc == 0 and "loaded" in load.err), f"rc {r.rc}, transformers: {load.rc}"

  def case_n28(self):
    """N28 dtypes: bf16 HF model with --param_dtype=bfloat16 (the startup line says so)"""
    _, bf16 = self.hf()
    r = grpo([f"--model={bf16}", f"--task=jsonl:{self.sums}", "--param_dtype=bfloat16",
              "--learning_rate=1e-6", f"--out_dir={self.d('n28')}"], steps=3)
    return verdict(r, r.rc == 0 and "masters + moments bfloat16" in r.err), f"rc {r.rc}"

  def case_n29(self):
    """N29 dtypes: --resume --rollout_dtype=bfloat16 on a float32-rollout run"""
    out = self.d("n29")
    grpo([f"--out_dir={out}", "--save_every=1"])
    r = grpo([f"--out_dir={out}", "--resume", "--rollout_dtype=bfloat16"], steps=4)
    return verdict(r, error=r"rollout_dtype"), first_error(r)

  def case_n30(self):
    """N30 dtypes: --resume --export_dtype=float32"""
    out = self.d("n30")
    grpo([f"--out_dir={out}", "--save_every=1"])
    r = grpo([f"--out_dir={out}", "--resume", "--export_dtype=float32",
              f"--export_hf={self.d('n30hf')}"], steps=3)
    return verdict(r, r.rc == 0 and os.path.exists(self.d("n30hf/config.json"))), f"rc {r.rc}"

  # ---- outputs and locks ----------------------------------------------------------------------
  def case_n31(self):
    """N31 outputs: --export_hf= a non-empty directory"""
    self.write("n31hf/keep.txt", "x")
    return self._error_case([f"--export_hf={self.d('n31hf')}", f"--out_dir={self.d('n31')}"],
                            r"is not empty.*before training")

  def case_n32(self):
    """N32 outputs: --export_hf= a non-empty directory with --overwrite"""
    self.write("n32hf/keep.txt", "x")
    out = self.d("n32")
    r = grpo([f"--export_hf={self.d('n32hf')}", f"--out_dir={out}", "--overwrite"])
    ok = r.rc == 0 and os.path.exists(self.d("n32hf/keep.txt")) and os.path.exists(
        self.d("n32hf/config.json"))
    return verdict(r, ok), f"rc {r.rc}"

  def _live(self, name: str, second: Callable[[], Result], steps: int = 400):
    """Runs a long run A; once it has a checkpoint, `second()` runs; then A gets SIGTERM.
    Returns (A's result, the second's result, A's out dir)."""
    out = self.d(name)
    got: list[Result] = []

    def act(p):
      _wait(lambda: _ckpts(out), p, timeout=200)
      got.append(second())
      p.send_signal(signal.SIGTERM)
    a = grpo(["--save_every=2", f"--out_dir={out}"], steps=steps, act=act, timeout=400)
    return a, got[0] if got else None, out

  def case_n33(self):
    """N33 locks: --resume on a live run's --out_dir"""
    a, b, out = self._live("n33", lambda: grpo([f"--out_dir={self.d('n33')}", "--resume"],
                                               steps=3))
    return verdict(b, error=r"in use by the running job of pid \d+"), first_error(b)

  def case_n34(self):
    """N34 locks: another run with --checkpoint_dir=<live run>/checkpoints --resume"""
    live = self.d("n34")
    a, b, out = self._live("n34", lambda: grpo([
        f"--out_dir={self.d('n34b')}", f"--checkpoint_dir={live}/checkpoints", "--resume",
        "--save_every=2"], steps=6))
    rows, ck = _rows(out), _ckpts(out)
    lost = a.rc != 0 or not ck or ck[-1] != rows[-1] or TB in a.err
    if lost:
      return "data lost", f"A: rc {a.rc}, checkpoints {ck[-2:]}, rows to {rows[-1:]}; B rc {b.rc}"
    return verdict(b, error=r"in use by the running job of pid \d+"), first_error(b)

  def case_n35(self):
    """N35 locks: .lock holds garbage"""
    out = self.d("n35")
    grpo([f"--out_dir={out}"])
    self.write("n35/.lock", "garbage{")
    return self._error_case([f"--out_dir={out}", "--resume"], r"unreadable lock file")

  def case_n36(self):
    """N36 locks: .lock of another host"""
    out = self.d("n36")
    grpo([f"--out_dir={out}"])
    self.write("n36/.lock", json.dumps({"pid": 1, "host": "elsewhere.example", "proc_start": 1}))
    return self._error_case([f"--out_dir={out}", "--resume"], r"another host")

  def case_n37(self):
    """N37 locks: .lock naming a live pid (1) with another proc_start: reclaimed"""
    import socket  # pylint: disable=import-outside-toplevel
    out = self.d("n37")
    grpo([f"--out_dir={out}", "--save_every=1"])
    self.write("n37/.lock", json.dumps({"pid": 1, "host": socket.gethostname(),
                                         "proc_start": 12345}))
    r = grpo([f"--out_dir={out}", "--resume", "--save_every=1"], steps=3)
    return verdict(r, r.rc == 0 and _rows(out) == [1, 2, 3]), f"rc {r.rc}, rows {_rows(out)}"

  def case_n38(self):
    """N38 locks: --resume of a run in a read-only directory"""
    if not can_mount():
      return "skipped", "needs root for a read-only bind mount"
    out = self.d("n38")
    grpo([f"--out_dir={out}", "--save_every=1"])
    subprocess.run(["mount", "--bind", "-o", "ro", out, out], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", out], check=False)
    try:
      return self._error_case([f"--out_dir={out}", "--resume"], r"read-only", steps=3)
    finally:
      subprocess.run(["umount", "-l", out], check=False)

  def case_n39(self):
    """N39 locks: an empty .lock"""
    out = self.d("n39")
    grpo([f"--out_dir={out}"])
    self.write("n39/.lock", "")
    return self._error_case([f"--out_dir={out}", "--resume"], r"lock")

  def case_n40(self):
    """N40 locks: a stale lock from a SIGKILLed run is reclaimed"""
    out = self.d("n40")

    def act(p):
      _wait(lambda: _ckpts(out), p)
      p.kill()
    grpo(["--save_every=2", f"--out_dir={out}"], steps=400, act=act)
    last = (_ckpts(out) or [0])[-1]
    r = grpo([f"--out_dir={out}", "--resume"], steps=last + 1)
    return verdict(r, r.rc == 0 and "reclaimed a stale lock" in r.err), f"rc {r.rc}"

  def case_n41(self):
    """N41 outputs: SIGKILL as N.orbax-checkpoint-tmp appears, then --resume"""
    out = self.d("n41")

    def saving():
      d = os.path.join(out, "checkpoints")
      return os.path.isdir(d) and any("tmp" in n for n in os.listdir(d)) and _ckpts(out)

    def act(p):
      _wait(saving, p)
      p.kill()
    grpo(["--save_every=2", f"--out_dir={out}"], steps=8, act=act)
    r = grpo(["--save_every=2", f"--out_dir={out}", "--resume"], steps=8)
    rows = _rows(out)
    ok = r.rc == 0 and rows == list(range(1, 9)) and not [
        n for n in os.listdir(f"{out}/checkpoints") if "tmp" in n]
    return verdict(r, ok), f"rc {r.rc}, rows {rows}"

  def case_n43(self):
    """N43 outputs: --resume --mesh=2x1 on a 1x1 run"""
    out = self.d("n43")
    grpo([f"--out_dir={out}", "--save_every=1"])
    r = grpo([f"--out_dir={out}", "--resume", "--mesh=2x1"], steps=3)
    return verdict(r, r.rc == 0 and "'1x1' -> '2x1'" in r.err), f"rc {r.rc}"

  def case_n44(self):
    """N44 outputs: --resume --steps=2 at step 2"""
    out = self.d("n44")
    grpo([f"--out_dir={out}", "--save_every=1"])
    r = grpo([f"--out_dir={out}", "--resume"], steps=2)
    return verdict(r, r.rc == 0 and "nothing left to train" in r.err), f"rc {r.rc}"

  # ---- several processes ---------------------------------------------------------------------
  def _mp_env(self) -> dict:
    return {"XLA_FLAGS": "--xla_backend_optimization_level=0"}

  def _mp(self, name: str, port: int, pid: int, extra=(), **kw) -> list[str]:
    del name
    return [*GRPO, *SHAPES, "--mesh=2x1", "--num_processes=2",
            f"--coordinator_address=127.0.0.1:{port}", f"--process_id={pid}", *extra]

  def _pair(self, name: str, extra0=(), extra1=(), act1=None, steps=3, timeout=240,
            start1=True, delay1=0.0) -> tuple[Result, Result | None]:
    """Runs processes 0 and 1 of one job (process 1 optional, delayed, acted on)."""
    port = _free_port()
    out = self.d(name)
    base = [f"--out_dir={out}", f"--steps={steps}", "--distributed_timeout=20"]
    env = dict(_env(), **self._mp_env())
    t0 = time.monotonic()
    p0 = subprocess.Popen(self._mp(name, port, 0, (*base, *extra0)), cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    p1 = None
    if start1:
      time.sleep(delay1)
      p1 = subprocess.Popen(self._mp(name, port, 1, (*base, *extra1)), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      if act1 is not None:
        act1(p0, p1, out)
    results = []
    for p in (p0, p1):
      if p is None:
        results.append(None)
        continue
      try:
        o, _ = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        results.append(Result(p.returncode, o, time.monotonic() - t0))
      except subprocess.TimeoutExpired:
        p.kill()
        o, _ = p.communicate()
        results.append(Result(None, o, time.monotonic() - t0, timed_out=True))
    return results[0], results[1]

  def case_n42(self):
    """N42 processes: a 2-process run (3 steps) resumed to 5 with 1 process"""
    r0, r1 = self._pair("n42", extra0=["--save_every=1"], extra1=["--save_every=1"])
    out = self.d("n42")
    r = grpo([f"--out_dir={out}", "--resume", "--mesh=2x1"], steps=5)
    ok = r0.rc == 0 and r1.rc == 0 and r.rc == 0 and _rows(out) == [1, 2, 3, 4, 5]
    return verdict(r, ok), f"pair rc {r0.rc}/{r1.rc}, resumed rc {r.rc}, rows {_rows(out)}"

  def case_n45(self):
    """N45 processes: process 0 only (process 1 never started)"""
    r0, _ = self._pair("n45", start1=False, timeout=150)
    return verdict(r0, error=r"process 1 .*(did not|never|lost)", codes=(4,)), first_error(r0)

  def case_n46(self):
    """N46 processes: process 1 only (the coordinator never started)"""
    port = _free_port()
    r = run(self._mp("n46", port, 1, (f"--out_dir={self.d('n46')}", "--steps=3",
                                      "--distributed_timeout=20")), env=self._mp_env(),
            timeout=150)
    return verdict(r, error=r"process 0|coordinator", codes=(4,)), first_error(r)

  def case_n47(self):
    """N47 processes: --process_id=5 --num_processes=2"""
    r = run(self._mp("n47", _free_port(), 5, (f"--out_dir={self.d('n47')}",)),
            env=self._mp_env(), timeout=120)
    return verdict(r, error=r"must lie in \[0, 2\)"), first_error(r)

  def case_n48(self):
    """N48 processes: --process_id=-1"""
    r = run(self._mp("n48", _free_port(), -1, (f"--out_dir={self.d('n48')}",)),
            env=self._mp_env(), timeout=120)
    return verdict(r, error=r"process_id"), first_error(r)

  def case_n49(self):
    """N49 processes: --coordinator_address=localhost (no port)"""
    r = run([*GRPO, *SHAPES, "--mesh=2x1", "--num_processes=2", "--coordinator_address=localhost",
             "--process_id=0", f"--out_dir={self.d('n49')}"], env=self._mp_env(), timeout=120)
    return verdict(r, error=r"coordinator_address=.?localhost.*PORT"), first_error(r)

  def case_n50(self):
    """N50 processes: the documented 2-process run; rollout_tokens summed over processes (J11)"""
    r0, r1 = self._pair("n50")
    rows = metrics(self.d("n50"))
    one = self.d("n50one")
    grpo([f"--out_dir={one}", "--mesh=2x1"], steps=3, env=self._mp_env())
    ref = metrics(one)
    tokens = [x.get("rollout_tokens") for x in rows]
    want = [x.get("rollout_tokens") for x in ref]
    ok = r0.rc == 0 and r1.rc == 0 and tokens == want
    return verdict(r0, ok), f"rc {r0.rc}/{r1.rc}, rollout_tokens {tokens} (one process {want})"

  def case_n51(self):
    """N51 processes: SIGKILL process 1 after step 1: process 0 names it, exit 4"""
    def act(p0, p1, out):
      _wait(lambda: len(_rows(out)) >= 1, p0, timeout=200)
      p1.kill()
    r0, _ = self._pair("n51", act1=act, steps=200, timeout=300)
    return verdict(r0, error=r"lost process 1 of 2", codes=(4,)), first_error(r0)

  def case_n52(self):
    """N52 processes: process 1 with another --seed"""
    r0, r1 = self._pair("n52", extra1=["--seed=7"], timeout=200)
    v = verdict(r1, error=r"seed", codes=(2, 4))
    v0 = verdict(r0, error=r"seed", codes=(2, 4))
    return (v if v == v0 else f"{v}"), f"p0 {first_error(r0)} | p1 {first_error(r1)}"

  def case_n53(self):
    """N53 processes: process 1 with another --learning_rate"""
    r0, r1 = self._pair("n53", extra1=["--learning_rate=0.5"], timeout=200)
    if r0.rc == 0 and r1.rc == 0:
      return "silent wrong", "both exit 0 with different learning rates"
    return verdict(r1, error=r"learning_rate", codes=(2, 4)), f"p1 {first_error(r1)}"

  def case_j12(self):
    """J12 processes: SIGKILL process 0 (the coordinator): process 1 names it, exit 4"""
    def act(p0, p1, out):
      _wait(lambda: len(_rows(out)) >= 1, p0, timeout=200)
      p0.kill()
    _, r1 = self._pair("j12", act1=act, steps=200, timeout=300)
    return verdict(r1, error=r"lost process 0 of 2", codes=(4,)), first_error(r1)

  # ---- weight stores and Ray ------------------------------------------------------------------
  RAY = ["--rollout=ray", "--num_workers=2", "--sft_steps=5"]

  def case_n54(self):
    """N54 stores: tensorstore directory deleted after v2 appears"""
    ws, out = self.d("n54ws"), self.d("n54")

    def act(p):
      if _wait(lambda: os.path.exists(f"{ws}/v2/manifest.json"), p, timeout=300):
        shutil.rmtree(ws, ignore_errors=True)
    r = grpo([*self.RAY, f"--weight_store=tensorstore:{ws}", f"--out_dir={out}"], steps=4,
             act=act, timeout=500)
    return verdict(r, r.rc == 0 and _rows(out) == [1, 2, 3, 4]), f"rc {r.rc}, rows {_rows(out)}"

  def case_n55(self):
    """N55 stores: tensorstore store on a full 450 KB tmpfs"""
    if not can_mount():
      return "skipped", "needs root for a tmpfs"
    with Tmpfs(self.d("n55disk")) as disk:
      r = grpo([*self.RAY, f"--weight_store=tensorstore:{disk}/w", f"--out_dir={self.d('n55')}"],
               steps=3, timeout=400)
      left = [n for n in os.listdir(f"{disk}/w") if n.startswith("v")] if os.path.isdir(
          f"{disk}/w") else []
    v = verdict(r, error=r"No space left", codes=(1, 2), lost=bool(left))
    return v, f"{first_error(r)}; left {left}"

  def case_n56(self):
    """N56 stores: --out_dir on a full 450 KB tmpfs"""
    if not can_mount():
      return "skipped", "needs root for a tmpfs"
    with Tmpfs(self.d("n56disk")) as disk:
      r = grpo(["--save_every=2", f"--out_dir={disk}/run"], steps=4)
      ck = f"{disk}/run/checkpoints"
      left = [n for n in os.listdir(ck) if "tmp" in n] if os.path.isdir(ck) else []
    return verdict(r, error=r"disk is full|No space left", lost=bool(left)), (
        f"{first_error(r)}; partial {left}; {r.err.count(TB)} tracebacks")

  def case_n57(self):
    """N57 stores: --weight_store=tensorstore: (empty path)"""
    return self._error_case([*self.RAY, "--weight_store=tensorstore:"], r"weight store")

  def case_n58(self):
    """N58 stores: --weight_store=memory with Ray"""
    return self._error_case([*self.RAY, "--weight_store=memory"], r"memory")

  def case_n59(self):
    """N59 stores: --weight_store=bogus"""
    return self._error_case([*self.RAY, "--weight_store=bogus"], r"unknown weight store")

  def case_n60(self):
    """N60 stores: --weight_store=tensorstore:gs://... unreachable (no credentials/network)"""
    r = grpo([*self.RAY, "--weight_store=tensorstore:gs://jaxrl-probe-nonexistent/w",
              f"--out_dir={self.d('n60')}"], timeout=200,
             env={"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent.json"})
    return verdict(r, error=r"did not answer within|credentials|gs://", codes=(1, 2)), \
        first_error(r)

  def case_n61(self):
    """N61 ray: --chaos_kill_every=-3"""
    return self._error_case([*self.RAY, "--chaos_kill_every=-3"], r"chaos_kill_every")

  def case_n62(self):
    """N62 ray: --worker_token_delay=-1"""
    return self._error_case([*self.RAY, "--worker_token_delay=-1"], r"worker_token_delay",
                            timeout=120)

  def case_n63(self):
    """N63 ray: --worker_token_delay=nan"""
    return self._error_case([*self.RAY, "--worker_token_delay=nan"], r"worker_token_delay",
                            timeout=120)

  def case_n64(self):
    """N64 ray: --chaos_restart_after=-1 --chaos_kill_every=3"""
    return self._error_case([*self.RAY, "--chaos_restart_after=-1", "--chaos_kill_every=3"],
                            r"restart_after")

  def case_n65(self):
    """N65 ray: --worker_cpus=64"""
    return self._error_case([*self.RAY, "--worker_cpus=64"], r"CPU=64")

  def _chaos(self, name, every, delay, steps, act=None, session=False, extra=()):
    out = self.d(name)
    r = grpo([*self.RAY, f"--chaos_kill_every={every}", f"--worker_token_delay={delay}",
              "--prompts_per_step=8", f"--out_dir={out}", *extra], steps=steps, act=act,
             session=session, timeout=580)
    return r, out

  def case_n66(self):
    """N66 ray: --chaos_kill_every=1 --worker_token_delay=0.05 --steps=3 (kills faster than a
    worker starts)"""
    r, out = self._chaos("n66", 1, 0.05, 3)
    rows = metrics(out)
    full = all(x.get("num_sequences", 32) == 32 for x in rows)
    ok = r.rc == 0 and len(rows) == 3 and full and "paus" in r.err
    return verdict(r, ok), f"rc {r.rc} in {r.seconds:.0f} s, {len(rows)} rows"

  def case_j14(self):
    """J14 ray: chaos prints one line per kill / join / migration"""
    r, out = self._chaos("j14", 3, 0.5, 3)
    kills = len(re.findall(r"^chaos: .*kill", r.err, flags=re.M))
    ok = r.rc == 0 and kills >= 1 and len(_rows(out)) == 3
    return verdict(r, ok), f"rc {r.rc} in {r.seconds:.0f} s, {kills} kill lines, rows {_rows(out)}"

  def case_j15(self):
    """J15 ray: process-group SIGTERM during chaos leaves a checkpoint; --resume continues"""
    out = self.d("j15")

    def act(p):
      _wait(lambda: len(_rows(out)) >= 1, p, timeout=400)
      os.killpg(p.pid, signal.SIGTERM)
    r, _ = self._chaos("j15", 3, 0.5, 6, act=act, session=True, extra=["--save_every=100"])
    ck = _ckpts(out)
    if not ck:
      return ("hang" if r.timed_out else "data lost"), f"rc {r.rc} in {r.seconds:.0f} s, no ckpt"
    r2, _ = self._chaos("j15", 3, 0.5, ck[-1] + 1, extra=["--resume"])
    ok = r.rc == 0 and r2.rc == 0 and _rows(out) == list(range(1, ck[-1] + 2))
    return verdict(r, ok), f"rc {r.rc}, checkpoint {ck}, resumed rc {r2.rc}, rows {_rows(out)}"

  def case_n143(self):
    """N143 ray: --ray_address=auto while another Ray cluster runs (documented: joins it)"""
    return "skipped", "needs another user's Ray cluster; Ray's documented behaviour"

  # ---- rewards --------------------------------------------------------------------------------
  def _reward_case(self, name, body, *, ok_failures=None, error=None, codes=(2,), steps=2,
                   check=None):
    out = self.d(name)
    r = grpo([f"--task=jsonl:{self.sums}", f"--reward={self.reward(name, body)}",
              f"--out_dir={out}"], steps=steps, timeout=300)
    if error is not None:
      return verdict(r, error=error, codes=codes), first_error(r)
    fails = sum(x.get("reward_failures", 0) for x in metrics(out))
    ok = r.rc == 0 and (ok_failures is None or ok_failures(fails)) and (
        check is None or check(r, out))
    return verdict(r, ok), f"rc {r.rc}, reward_failures {fails:.0f}"

  def case_n67(self):
    """N67 rewards: np.float64 / np.int64 / np.bool_ / bool / 0-d array"""
    body = ("  import numpy as np\n  k = int(answer) % 5\n"
            "  return [np.float64(1), np.int64(0), np.bool_(True), False, np.array(0.5)][k]")
    return self._reward_case("n67", body, ok_failures=lambda f: f == 0)

  def case_n68(self):
    """N68 rewards: a 1-element array is a counted failure"""
    return self._reward_case("n68", "  import numpy as np\n  return np.array([1.0])",
                             ok_failures=lambda f: f > 0)

  def case_n69(self):
    """N69 rewards: 1+2j is a counted failure"""
    return self._reward_case("n69", "  return 1 + 2j", ok_failures=lambda f: f > 0)

  def case_n70(self):
    """N70 rewards: Decimal("0.5") is a counted failure"""
    return self._reward_case("n70", "  import decimal\n  return decimal.Decimal('0.5')",
                             ok_failures=lambda f: f > 0)

  def case_n71(self):
    """N71 rewards: 4e38 (does not fit float32) is a counted failure"""
    return self._reward_case("n71", "  return 4e38", ok_failures=lambda f: f > 0)

  def case_n72(self):
    """N72 rewards: -inf stops the run naming prompt and completion"""
    return self._reward_case("n72", "  return -math.inf", error=r"prompt")

  def case_n73(self):
    """N73 rewards: NaN on some rows"""
    return self._reward_case("n73", "  return math.nan if int(answer) % 3 == 0 else 1.0",
                             error=r"prompt")

  def case_n74(self):
    """N74 rewards: raises on odd-length completions: counted"""
    return self._reward_case("n74", "  if len(completion) % 2:\n    raise KeyError('odd')\n"
                             "  return 1.0", ok_failures=lambda f: f > 0)

  def case_n75(self):
    """N75 rewards: a random reward"""
    return self._reward_case("n75", "  import random\n  return random.random()")

  def case_n76(self):
    """N76 rewards: a reward that sleeps 0.05 s"""
    return self._reward_case("n76", "  time.sleep(0.05)\n  return 1.0", steps=1)

  def case_n77(self):
    """N77 rewards: the reward calls sys.exit(3)"""
    out = self.d("n77")
    r = grpo([f"--task=jsonl:{self.sums}", f"--reward={self.reward('n77', '  sys.exit(3)')}",
              f"--out_dir={out}"], timeout=300)
    if r.rc == 3 and "error:" not in r.err:
      return "silent wrong", "exit 3 (the 'diverged' code), no message"
    fails = sum(x.get("reward_failures", 0) for x in metrics(out))
    if r.rc == 0:
      return verdict(r, fails > 0 and "SystemExit" in r.err), f"rc 0, failures {fails:.0f}"
    return verdict(r, error=r"SystemExit|sys\.exit", codes=(2, 5)), first_error(r)

  def case_n78(self):
    """N78 rewards: the reward raises KeyboardInterrupt"""
    out = self.d("n78")
    r = grpo([f"--task=jsonl:{self.sums}",
              f"--reward={self.reward('n78', '  raise KeyboardInterrupt')}", f"--out_dir={out}"],
             timeout=300)
    return verdict(r, r.rc == 130 and "interrupted" in r.err), f"rc {r.rc}"

  def case_n79(self):
    """N79 rewards: infinite recursion is a counted failure"""
    return self._reward_case("n79", "  return score(prompt, completion, answer)",
                             ok_failures=lambda f: f > 0)

  def case_n80(self):
    """N80 rewards: MemoryError is a counted failure"""
    return self._reward_case("n80", "  raise MemoryError('x')", ok_failures=lambda f: f > 0)

  # ---- data ---------------------------------------------------------------------------------
  def _data_case(self, name, text, *, error=None, args=(), steps=2, check=None):
    path = self.write(f"{name}.jsonl", text)
    out = self.d(name)
    r = grpo([f"--task=jsonl:{path}", f"--out_dir={out}", *args], steps=steps)
    if error is not None:
      return verdict(r, error=error), first_error(r)
    ok = r.rc == 0 and bool(_rows(out)) and (check is None or check(r, out))
    return verdict(r, ok), f"rc {r.rc}, rows {_rows(out)}"

  def _rows_text(self, rows, sep="\n") -> str:
    return sep.join(json.dumps(r, ensure_ascii=False) for r in rows) + sep

  def _sum_rows(self, n=20):
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)][:n]

  def case_n81(self):
    """N81 data: a JSONL that starts with a UTF-8 BOM"""
    return self._data_case("n81", "\ufeff" + self._rows_text(self._sum_rows()))

  def case_n82(self):
    """N82 data: CRLF line ends"""
    return self._data_case("n82", self._rows_text(self._sum_rows(), "\r\n"))

  def case_n83(self):
    """N83 data: CJK and emoji in prompts"""
    rows = [{"prompt": f"{a}+{b}=几？🙂", "answer": str(a + b)} for a in range(4) for b in range(4)]
    return self._data_case("n83", self._rows_text(rows))

  def case_n84(self):
    """N84 data: row 6 lacks 'answer' (default exact match)"""
    rows = self._sum_rows()
    del rows[6]["answer"]
    return self._data_case("n84", self._rows_text(rows), error=r"answer")

  def case_n85(self):
    """N85 data: a 0-byte JSONL"""
    return self._data_case("n85", "", error=r"no rows")

  def case_n86(self):
    """N86 data: every row has the same id"""
    return self._data_case("n86", self._rows_text([dict(r, id=1) for r in self._sum_rows()]))

  def case_n87(self):
    """N87 data: one row, 4 prompts per step"""
    return self._data_case("n87", self._rows_text(self._sum_rows(1)))

  def case_n88(self):
    """N88 data: only blank lines"""
    return self._data_case("n88", "\n  \n\n", error=r"no rows")

  def case_n89(self):
    """N89 data: "answer": null in row 4"""
    rows = self._sum_rows()
    rows[4]["answer"] = None
    return self._data_case("n89", self._rows_text(rows), error=r"answer")

  def case_n90(self):
    """N90 data: a repeated key ({"prompt": "8+2=", "prompt": "", ...})"""
    text = "".join('{"prompt": "%d+2=", "prompt": "", "answer": "%d"}\n' % (a, a + 2)
                   for a in range(10))
    out = self.d("n90")
    r = grpo([f"--task=jsonl:{self.write('n90.jsonl', text)}", f"--out_dir={out}"])
    if r.rc == 0:
      return "silent wrong", "trained on the last value (empty prompts), no note"
    return verdict(r, error=r"'prompt' appears twice"), first_error(r)

  def case_n91(self):
    """N91 data: one row with --eval_every=1"""
    return self._data_case("n91", self._rows_text(self._sum_rows(1)), args=["--eval_every=1"],
                           error=r"cannot hold out")

  def case_n92(self):
    """N92 data: --eval_prompts=100 on 100 rows"""
    return self._data_case("n92", self._rows_text(self._sum_rows(100)),
                           args=["--eval_every=1", "--eval_prompts=100"], error=r"eval_prompts")

  def case_n93(self):
    """N93 data: --eval_prompts=-5"""
    return self._data_case("n93", self._rows_text(self._sum_rows()),
                           args=["--eval_every=1", "--eval_prompts=-5"], error=r"eval_prompts")

  def case_j9(self):
    """J9 data: prompts with characters the tiny HF model's tokenizer does not know"""
    tiny, _ = self.hf()
    rows = [{"prompt": f"what is {a}*{b}?", "answer": str(a * b)} for a in range(4)
            for b in range(4)]
    path = self.write("j9.jsonl", self._rows_text(rows))
    r = grpo([f"--model={tiny}", f"--task=jsonl:{path}", f"--out_dir={self.d('j9')}"])
    note = re.search(r"rows hold characters the model's tokenizer does not know", r.err)
    return verdict(r, r.rc == 0 and bool(note)), f"rc {r.rc}, note: {bool(note)}"

  # ---- the simulator (its cases are the sim engineer's part of the issue) --------------------
  def _sim(self, name, args, error, codes=(2,), timeout=150):
    r = run([*SIM, f"--out_dir={self.d(name)}", *args], timeout=timeout)
    return verdict(r, error=error, codes=codes), first_error(r)

  def _trace(self, name, text):
    return self.write(f"{name}.csv", text)

  def case_n94(self):
    """N94 sim: --trace=<empty file>"""
    return self._sim("n94", ["--trace=" + self._trace('n94', '')], r"empty")

  def case_n95(self):
    """N95 sim: bamboo trace with time going back"""
    t = self._trace("n95", "time,node,action\n10,a,add\n5,b,add\n")
    return self._sim("n95", [f"--trace={t}"], r"backwards")

  def case_n96(self):
    """N96 sim: counts trace 0,-3"""
    return self._sim("n96", ["--trace=" + self._trace('n96', '0,2\n60,-3\n')], r"negative")

  def case_n97(self):
    """N97 sim: a garbage trace"""
    return self._sim("n97", ["--trace=" + self._trace('n97', 'hello world\n%%%\n')], r"format")

  def case_n98(self):
    """N98 sim: bamboo action 'remov'"""
    t = self._trace("n98", "time,node,action\n0,a,add\n10,a,remov\n")
    return self._sim("n98", [f"--trace={t}"], r"remov")

  def case_n99(self):
    """N99 sim: counts trace 60,abc"""
    return self._sim("n99", ["--trace=" + self._trace('n99', '0,2\n60,abc\n')], r"abc|integer")

  def case_n100(self):
    """N100 sim: a one-event trace"""
    return self._sim("n100", ["--trace=" + self._trace('n100', '0,2\n')], r"nothing to replay",
                     codes=(1, 2))

  def case_n101(self):
    """N101 sim: a bamboo trace that only removes"""
    t = self._trace("n101", "time,node,action\n0,a,remove\n10,b,remove\n")
    return self._sim("n101", [f"--trace={t}"], r"not live")

  def case_n102(self):
    """N102 sim: ISO counts trace with a line going back"""
    t = self._trace("n102", "timestamp,count\n2024-01-01T00:00:00,2\n2024-01-01T01:00:00,3\n"
                    "2024-01-01T00:30:00,1\n2024-01-01T02:00:00,2\n")
    return self._sim("n102", [f"--trace={t}"], r"back|baseline")

  def case_n103(self):
    """N103 sim: counts trace 0,1e9"""
    return self._sim("n103", ["--trace=" + self._trace('n103', '0,1e9\n60,2\n')],
                     r"1e9|1000000000|instances", timeout=120)

  def case_n104(self):
    """N104 sim: counts 0,nan then 60,2"""
    return self._sim("n104", ["--trace=" + self._trace('n104', '0,nan\n60,2\n')],
                     r"nan|spans 0 s", codes=(1, 2))

  def case_n105(self):
    """N105 sim: skypilot gap_seconds: -60"""
    t = self.write("n105.json", json.dumps({"gap_seconds": -60, "data": [1, 2, 3]}))
    return self._sim("n105", [f"--trace={t}", "--trace_format=skypilot"], r"gap_seconds")

  def case_n106(self):
    """N106 sim: skypilot with data: []"""
    t = self.write("n106.json", json.dumps({"gap_seconds": 60, "data": []}))
    return self._sim("n106", [f"--trace={t}", "--trace_format=skypilot"], r"nothing to replay",
                     codes=(1, 2))

  def case_n107(self):
    """N107 sim: a bamboo file with --trace_format=parcae"""
    t = self._trace("n107", "time,node,action\n0,a,add\n10,b,add\n")
    return self._sim("n107", [f"--trace={t}", "--trace_format=parcae"], r"parcae")

  def case_n108(self):
    """N108 sim: --trace_format=xml"""
    return self._sim("n108", ["--trace_format=xml"], r"xml", codes=(1, 2))

  def case_n109(self):
    """N109 sim: --trace_time_scale=1e12 --segments=0"""
    return self._sim("n109", ["--trace_time_scale=1e12", "--segments=0"], r"trace_time_scale",
                     timeout=120)

  def case_n110(self):
    """N110 sim: --trace_time_scale=0 / -1 / nan"""
    got = [self._sim(f"n110{i}", [f"--trace_time_scale={v}"], r"trace_time_scale")
           for i, v in enumerate(("0", "-1", "nan"))]
    worst = next((v for v, _ in got if v != "clear error"), "clear error")
    return worst, "; ".join(d[:50] for _, d in got)

  def case_n111(self):
    """N111 sim: --segments=99"""
    return self._sim("n111", ["--segments=99"], r"no segment \[99\]", codes=(1, 2))

  def case_n112(self):
    """N112 sim: --preset=qwen3-9b"""
    r = run([*SIM[:3], "--preset=qwen3-9b", *SIM[4:], f"--out_dir={self.d('n112')}"])
    return verdict(r, error=r"unknown model preset"), first_error(r)

  def case_n113(self):
    """N113 sim: --settings=rlbost"""
    r = run([*SIM[:4], "--settings=rlbost", *SIM[5:], f"--out_dir={self.d('n113')}"])
    return verdict(r, error=r"unknown settings"), first_error(r)

  def case_n114(self):
    """N114 sim: --sample=0"""
    r = run([*SIM, "--sample=0", "--segments=0", f"--out_dir={self.d('n114')}"], timeout=300)
    return verdict(r, r.rc == 0), f"rc {r.rc} in {r.seconds:.0f} s"

  def case_n115(self):
    """N115 sim: --segment_hours=0"""
    return self._sim("n115", ["--segment_hours=0"], r"must be > 0", codes=(1, 2))

  def case_n116(self):
    """N116 sim: --length_median=-5"""
    return self._sim("n116", ["--length_median=-5"], r"median")

  def case_n117(self):
    """N117 sim: --trace= a missing file"""
    return self._sim("n117", [f"--trace={self.d('nope.csv')}"], r"nope\.csv")

  def case_n118(self):
    """N118 sim: plain run on a fresh clone (the default trace ships with the package now)"""
    r = run([*SIM, "--segments=0", f"--out_dir={self.d('n118')}"], timeout=300,
            env={"JAXRL_TRACES_DIR": ""})
    return verdict(r, r.rc == 0), f"rc {r.rc} in {r.seconds:.0f} s"

  def case_n119(self):
    """N119 sim: grpo --preempt_trace= a garbage / an empty file"""
    got = [grpo([*self.RAY, "--preempt_trace=" + self._trace(n, t)])
           for n, t in (("n119a", "garbage\n%%\n"), ("n119b", ""))]
    vs = [verdict(r, error=r"preempt_trace") for r in got]
    return next((v for v in vs if v != "clear error"), "clear error"), first_error(got[0])

  def case_n120(self):
    """N120 sim: grpo --preempt_trace= the 0,1e9 counts file"""
    r = grpo([*self.RAY, "--preempt_trace=" + self._trace('n120', '0,1e9\n60,2\n'),
              f"--out_dir={self.d('n120')}"], timeout=150)
    return verdict(r, error=r"preempt_trace|instances"), first_error(r)

  # ---- signals --------------------------------------------------------------------------------
  def case_n121(self):
    """N121 signals: SIGTERM during the first compile (--compile_cache= off)"""
    out = self.d("n121")

    def act(p):
      _wait(lambda: os.path.exists(f"{out}/config.json"), p)
      time.sleep(1.0)
      p.send_signal(signal.SIGTERM)
    r = run([*GRPO, *SHAPES[:-1], "--compile_cache=", "--steps=20", f"--out_dir={out}"],
            act=act, timeout=300)
    return verdict(r, r.rc == 0 and bool(_ckpts(out))), f"rc {r.rc}, checkpoints {_ckpts(out)}"

  def case_n122(self):
    """N122 signals: SIGTERM during eval (--eval_every=2)"""
    out = self.d("n122")

    def act(p):
      _wait(lambda: len(_rows(out)) >= 1, p)
      p.send_signal(signal.SIGTERM)
    r = grpo(["--eval_every=2", "--eval_prompts=8", f"--out_dir={out}"], steps=40, act=act)
    return verdict(r, r.rc == 0 and bool(_ckpts(out))), f"rc {r.rc}, checkpoints {_ckpts(out)}"

  def case_n123(self):
    """N123 signals: SIGTERM during the last step with --export_hf"""
    out, hf = self.d("n123"), self.d("n123hf")

    def act(p):
      _wait(lambda: len(_rows(out)) >= 2, p)
      p.send_signal(signal.SIGTERM)
    r = grpo([f"--out_dir={out}", f"--export_hf={hf}"], steps=3, act=act)
    ok = r.rc == 0 and (os.path.exists(f"{hf}/config.json") or "not written" in r.err)
    return verdict(r, ok), f"rc {r.rc}"

  def case_n124(self):
    """N124 signals: SIGTERM after the outputs are listed (teardown)"""
    out = self.d("n124")

    def act(p):
      _wait(lambda: os.path.exists(f"{out}/final_params.npz"), p)
      p.send_signal(signal.SIGTERM)
    r = grpo([f"--out_dir={out}"], act=act)
    ok = os.path.exists(f"{out}/final_params.npz") and _rows(out) == [1, 2]
    return verdict(r, ok and r.rc in (0, 143)), f"rc {r.rc}"

  def case_n125(self):
    """N125 signals: SIGHUP at step 2 (a closed SSH terminal)"""
    out = self.d("n125")

    def act(p):
      _wait(lambda: len(_rows(out)) >= 1, p)
      p.send_signal(signal.SIGHUP)
    r = grpo(["--save_every=2", f"--out_dir={out}"], steps=6, act=act)
    rows, ck = _rows(out), _ckpts(out)
    lost = not ck or ck[-1] != rows[-1] or os.path.exists(f"{out}/.lock")
    return verdict(r, r.rc in (0, 129), lost=lost), f"rc {r.rc}, rows {rows}, checkpoints {ck}"

  def case_n126(self):
    """N126 signals: SIGINT twice 0.2 s apart"""
    out = self.d("n126")

    def act(p):
      _wait(lambda: len(_ckpts(out)) >= 1, p)
      p.send_signal(signal.SIGINT)
      time.sleep(0.2)
      p.send_signal(signal.SIGINT)
    r = grpo(["--save_every=1", f"--out_dir={out}"], steps=400, act=act)
    half = [n for n in os.listdir(f"{out}/checkpoints") if "tmp" in n]
    return verdict(r, r.rc == 130 and not half, lost=bool(half)), f"rc {r.rc}"

  # ---- losses (the API) ------------------------------------------------------------------------
  _LOSS = """
import numpy as np, jax, jax.numpy as jnp, sys
from jaxrl_sys import losses as L
rng = np.random.default_rng(0)
B, T = 4, 6
lp = rng.normal(-1.5, 0.3, (B, T)).astype(np.float32)
old = (lp + 0.05).astype(np.float32)
adv = np.array([1.0, -1.0, 0.5, 0.0], np.float32)
mask = np.ones((B, T), np.float32)
try:
  out = {body}
  print("RESULT", out)
except Exception as e:
  print("error:", type(e).__name__, str(e).splitlines()[0][:300])
  sys.exit(2)
"""

  def _loss(self, body: str, *, error: str | None = None, ok: Callable[[str], bool] = None):
    r = py(self._LOSS.replace("{body}", body))
    if error is not None:
      return verdict(r, error=error), first_error(r)
    res = next((s for s in r.err.splitlines() if s.startswith("RESULT")), "")
    return verdict(r, r.rc == 0 and (ok is None or ok(res))), res[:120] or first_error(r)

  def case_n127(self):
    """N127 losses: grpo_loss advantages [B,1] / [1] / scalar"""
    got = [self._loss(f"L.grpo_loss(lp, old, {a}, mask, kl_coef=0.0)", error=r"Assertion|rank")
           for a in ("adv[:, None]", "adv[:1]", "np.float32(1.0)")]
    return next((v for v, _ in got if v != "clear error"), "clear error"), got[0][1]

  def case_n128(self):
    """N128 losses: per-token advantages [B,T] give the [B] loss"""
    return self._loss("float(L.grpo_loss(lp, old, np.repeat(adv[:, None], T, 1), mask, "
                      "kl_coef=0.0).loss - L.grpo_loss(lp, old, adv, mask, kl_coef=0.0).loss)",
                      ok=lambda s: abs(float(s.split()[-1])) < 1e-6)

  def case_n129(self):
    """N129 losses: [T,B] arrays when B == T (cannot be told from the shapes)"""
    return self._loss("float(L.grpo_loss(lp[:, :4].T, old[:, :4].T, adv, mask[:, :4], "
                      "kl_coef=0.0).loss)")

  def case_n130(self):
    """N130 losses: mask [B], old [B,T+1], ref [B,1], logits [B,T,V]"""
    got = [self._loss(b, error=r"Assertion|shape|rank") for b in (
        "L.grpo_loss(lp, old, adv, mask[:, 0], kl_coef=0.0)",
        "L.grpo_loss(lp, np.pad(old, ((0, 0), (0, 1))), adv, mask, kl_coef=0.0)",
        "L.grpo_loss(lp, old, adv, mask, ref_logprobs=old[:, :1])",
        "L.grpo_loss(np.zeros((B, T, 5), np.float32), old, adv, mask, kl_coef=0.0)")]
    return next((v for v, _ in got if v != "clear error"), "clear error"), got[0][1]

  def case_n131(self):
    """N131 losses: a mask of 2s, or of -1s"""
    got = [self._loss(f"float(L.grpo_loss(lp, old, adv, mask * {s}, kl_coef=0.0).loss)",
                      error=r"mask.*other than 0 and 1") for s in ("2", "-1")]
    return next((v for v, _ in got if v != "clear error"), "clear error"), got[0][1]

  def case_n132(self):
    """N132 losses: int mask; float16 log-probs; int advantages"""
    return self._loss("float(L.grpo_loss(lp.astype(np.float16), old.astype(np.float16), "
                      "np.array([1, -1, 0, 2]), mask.astype(np.int32), kl_coef=0.0).loss)")

  def case_n133(self):
    """N133 losses: probabilities (0-1) passed as log-probs"""
    return self._loss("float(L.grpo_loss(np.exp(lp), np.exp(old), adv, mask, kl_coef=0.0).loss)",
                      error=r"above 0")

  def case_n134(self):
    """N134 losses: denominator=0.0"""
    return self._loss("float(L.grpo_loss(lp, old, adv, mask, kl_coef=0.0, denominator=0.0)"
                      ".loss)", error=r"denominator")

  def case_n135(self):
    """N135 losses: denominator=-4.0"""
    return self._loss("float(L.grpo_loss(lp, old, adv, mask, kl_coef=0.0, denominator=-4.0)"
                      ".loss)", error=r"denominator")

  def case_n136(self):
    """N136 losses: group_advantages of int / bool / float64 / list rewards"""
    return self._loss("[np.asarray(L.group_advantages(r, group_size=2).advantages).tolist() for "
                      "r in (np.array([1, 0, 1, 1]), np.array([True, False, True, True]), "
                      "np.array([1.0, 0, 1, 1]), [1.0, 0.0, 1.0, 1.0])]",
                      ok=lambda s: s.count("[0.7071") == 4)

  def case_n137(self):
    """N137 losses: group_advantages (2,4) with group_size=2; [B,1]; 3-D; group_size=2.5"""
    got = [self._loss(b, error=r"group_size|Assertion|rank|multiple|members") for b in (
        "L.group_advantages(np.zeros((2, 4)), group_size=2)",
        "L.group_advantages(np.zeros((4, 1)))",
        "L.group_advantages(np.zeros((2, 2, 2)), group_size=2)",
        "L.group_advantages(np.zeros(4), group_size=2.5)")]
    return next((v for v, _ in got if v != "clear error"), "clear error"), got[0][1]

  def case_n138(self):
    """N138 losses: group_advantages of complex rewards"""
    return self._loss("L.group_advantages(np.array([1 + 1j, 0, 1, 0]), group_size=2)",
                      error=r"complex")

  def case_n139(self):
    """N139 losses: kl k4; preset('GRPO'); loss_denominator(mask, 'grpo'); clip_eps="""
    got = [self._loss(b, error=r"unknown|choose|unexpected keyword|clip_eps") for b in (
        "L.kl_estimate(lp, old, 'k4')", "L.preset('GRPO')", "L.loss_denominator(mask, 'grpo')",
        "L.grpo_loss(lp, old, adv, mask, kl_coef=0.0, clip_eps=0.3)")]
    return next((v for v, _ in got if v != "clear error"), "clear error"), got[0][1]

  def case_n140(self):
    """N140 losses: mismatch_stats shape mismatch; effective_sample_size([])"""
    got = [self._loss(b, error=r"shape|empty|zero-size") for b in (
        "L.mismatch_stats(lp, lp[:, :3], mask)", "L.effective_sample_size(jnp.zeros((0,)))")]
    return next((v for v, _ in got if v != "clear error"), "clear error"), got[-1][1]

  def case_n141(self):
    """N141 losses: NaN at masked positions; an all-zero mask"""
    return self._loss("(float(L.grpo_loss(np.where(np.arange(T) < 3, lp, np.nan), old, adv, "
                      "(np.arange(T) < 3) * mask, kl_coef=0.0).loss), float(L.grpo_loss(lp, old, "
                      "adv, 0 * mask, kl_coef=0.0).loss))",
                      ok=lambda s: "nan" not in s and s.endswith("0.0)"))

  def case_n142(self):
    """N142 losses: rollout API: duplicate request id; prompt > max_len; token >= vocab"""
    code = """
import sys, numpy as np
from jaxrl_sys.rollout import InProcessWorker, RolloutManager
from tests.rollout import common
m = RolloutManager([InProcessWorker("w0", common.CFG, common.engine_config())])
m.publish(common.params(), 0)
reqs = common.make_requests(2)
try:
  m.submit([reqs[0], reqs[0]])
  print("RESULT accepted")
except ValueError as e:
  print("error:", str(e)[:200]); sys.exit(2)
"""
    r = py(code)
    return verdict(r, error=r"request"), first_error(r)

  # ---- journeys -------------------------------------------------------------------------------
  def _doc(self, path: str) -> str:
    return open(os.path.join(REPO, path), encoding="utf-8").read()

  def case_j1(self):
    """J1 journeys: the README says to activate ./.venv (or use .venv/bin/python)"""
    ok = "source .venv/bin/activate" in self._doc("README.md")
    return ("ok" if ok else "silent wrong"), f"activation named: {ok}"

  def case_j2(self):
    """J2 journeys: a headless notebook command that exists (jupyter execute)"""
    cmd = "jupyter execute" in self._doc("README.md")
    exe = os.path.join(os.path.dirname(sys.executable), "jupyter")
    r = run([exe, "execute", "--help"], timeout=60)
    return verdict(r, cmd and r.rc == 0), f"in README: {cmd}, `jupyter execute --help` rc {r.rc}"

  def case_j3(self):
    """J3 journeys: notebook 01's first cell has no <org> placeholder URL"""
    bad = [n for n in sorted(os.listdir(os.path.join(REPO, "notebooks")))
           if "github.com/<org>" in self._doc(f"notebooks/{n}")]
    return ("silent wrong" if bad else "ok"), f"placeholder in {bad}"

  def case_j4(self):
    """J4 journeys: small-mode notebook 01 shows the reward not falling"""
    code = ("from tests.notebooks.runner import run_notebook\nimport tempfile, json\n"
            "nb, v = run_notebook('01_quickstart_grpo.ipynb', tempfile.mkdtemp(), probe=("
            "\"[h['reward_mean'] for h in result.history]\"))\nprint('RESULT', json.dumps(v))")
    r = py(code, timeout=400)
    res = next((s for s in r.err.splitlines() if s.startswith("RESULT")), "")
    if not res:
      return verdict(r, False), first_error(r)
    rewards = json.loads(res[7:])
    return verdict(r, rewards[-1] >= rewards[0]), f"rewards {[round(x, 3) for x in rewards]}"

  def case_j5(self):
    """J5 journeys: docs/losses.md shows MC-GRPO's G+1, its config, nnx wrt=, notebook 02"""
    doc = self._doc("docs/losses.md")
    want = ["G+1", 'preset("mc_grpo")', "wrt=nnx.Param", "02_losses_nnx.ipynb"]
    missing = [w for w in want if w not in doc]
    return ("silent wrong" if missing else "ok"), f"missing {missing}"

  def case_j6(self):
    """J6 journeys: step 1's zero learning rate (warm-up) is announced"""
    r = run([*GRPO, *[a for a in SHAPES if not a.startswith("--lr_warmup")], "--steps=1",
             f"--out_dir={self.d('j6')}"])
    said = bool(re.search(r"warm-up from 0", r.err))
    return verdict(r, r.rc == 0 and said), f"rc {r.rc}, announced: {said}"

  def case_j7(self):
    """J7 journeys: the docs no longer claim a CPU mismatch of 0.0"""
    bad = "0.0 on a CPU" in self._doc("docs/experiments.md")
    return ("silent wrong" if bad else "ok"), f"claim present: {bad}"

  def case_j8(self):
    """J8 journeys: --export_hf of a bf16 checkpoint keeps the training (lr 1e-6, 8 steps)"""
    _, bf16 = self.hf()
    out, hf = self.d("j8"), self.d("j8hf")
    r = grpo([f"--model={bf16}", f"--task=jsonl:{self.sums}", "--learning_rate=1e-6",
              f"--out_dir={out}", f"--export_hf={hf}"], steps=8, timeout=300)
    code = f"""
import numpy as np, jax
from jaxrl_sys.models import load_hf_checkpoint
_, a = load_hf_checkpoint({bf16!r}); _, b = load_hf_checkpoint({hf!r})
with np.load({out + '/final_params.npz'!r}) as z: trained = dict(z)
la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
moved = sum(int((np.asarray(x) != np.asarray(y)).sum()) for x, y in zip(la, lb))
print("RESULT", moved, sum(x.size for x in la))
"""
    c = py(code, timeout=200)
    res = next((s for s in c.err.splitlines() if s.startswith("RESULT")), "RESULT 0 1")
    moved, total = map(int, res.split()[1:])
    return verdict(r, r.rc == 0 and moved > 0.9 * total), (
        f"rc {r.rc}: the export differs from the input in {moved} of {total} parameters")

  def case_j10(self):
    """J10 journeys: models.save_hf_checkpoint(..., dtype=jnp.float32)"""
    code = f"""
import jax, jax.numpy as jnp
from jaxrl_sys import models
c = models.ModelConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                       head_dim=4, intermediate_size=16, max_seq_len=10,
                       architecture="Qwen3ForCausalLM", qk_norm=True)
try:
  models.save_hf_checkpoint({self.d('j10')!r}, c, models.init_params(c, jax.random.PRNGKey(0)),
                            dtype=jnp.float32)
  print("RESULT saved")
except ValueError as e:
  print("error:", e)
"""
    r = py(code)
    return verdict(r, "RESULT saved" in r.err), first_error(r) or "saved"

  def case_j16(self):
    """J16 journeys: docs point inside the repository (no ../shared links)"""
    bad = [n for n in sorted(os.listdir(os.path.join(REPO, "docs")))
           if "../shared" in self._doc(f"docs/{n}")]
    return ("silent wrong" if bad else "ok"), f"../shared in {bad}"

  def case_j17(self):
    """J17 journeys: docs/ray.md defines version_lag"""
    ok = bool(re.search(r"version_lag`?\s*(\||:|is|=|\()", self._doc("docs/ray.md")))
    return ("ok" if ok else "silent wrong"), f"defined: {ok}"


AREAS = {"n1": "config", "n17": "dtypes", "n31": "outputs", "n33": "locks", "n42": "processes",
         "n54": "stores", "n61": "ray", "n67": "rewards", "n81": "data", "n94": "sim",
         "n121": "signals", "n127": "losses", "j1": "journeys"}


def all_cases(probe: Probe) -> list[tuple[str, str, str, Callable]]:
  """(id, area, title, method) in the report's order."""
  out = []
  for name in dir(probe):
    if name.startswith("case_"):
      fn = getattr(probe, name)
      ident, area, title = fn.__doc__.split(None, 2)
      out.append((ident, area.rstrip(":"), " ".join(title.split()), fn))
  key = lambda c: (c[0][0] != "N", int(c[0][1:]))  # noqa: E731
  return sorted(out, key=key)


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", default="", help="comma-separated ids (N8, J3) or areas (config)")
  ap.add_argument("--skip", default="", help="the same, to leave out")
  ap.add_argument("--json", default="", help="write the verdicts here")
  ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
  ap.add_argument("--list", action="store_true", help="list the cases and exit")
  args = ap.parse_args()
  only = {x.strip().lower() for x in args.only.split(",") if x.strip()}
  skip = {x.strip().lower() for x in args.skip.split(",") if x.strip()}
  tmp = tempfile.mkdtemp(prefix="probe_cases_")
  probe = Probe(tmp)
  cases = all_cases(probe)
  if args.list:
    for ident, area, title, _ in cases:
      print(f"{ident:5s} {area:10s} {title}")
    return 0
  chosen = [c for c in cases if (not only or c[0].lower() in only or c[1] in only)
            and c[0].lower() not in skip and c[1] not in skip]
  table = []
  try:
    for ident, area, title, fn in chosen:
      t0 = time.monotonic()
      try:
        got, detail = fn()
      except Exception as e:  # pylint: disable=broad-except  (a harness failure, not a verdict)
        got, detail = "harness error", f"{type(e).__name__}: {e}"[:200]
      table.append({"id": ident, "area": area, "case": title, "verdict": got,
                    "detail": detail, "seconds": round(time.monotonic() - t0, 1)})
      print(f"{ident:5s} {got:13s} {title}: {detail}", file=sys.stderr, flush=True)
      if args.json:
        with open(args.json, "w") as f:
          json.dump(table, f, indent=1)
  finally:
    if not args.keep:
      subprocess.run(["umount", "-l", *[os.path.join(tmp, n) for n in os.listdir(tmp)
                                        if n.endswith("disk")]], capture_output=True, check=False)
      shutil.rmtree(tmp, ignore_errors=True)
  counts: dict[str, int] = {}
  for row in table:
    counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
  print("\n" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" ({len(table)} cases)")
  return 0


if __name__ == "__main__":
  sys.exit(main())

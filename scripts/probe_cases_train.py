"""The probe's cases of the run's settings, dtypes, outputs and locks (N1-N44)."""
from __future__ import annotations

from typing import Callable

import json
import os
import signal
import subprocess

from probe_lib import (TB, ProbeBase, Result, _ckpts, _rows, _wait, can_mount, first_error, grpo,
                       py, verdict)


class TrainCases(ProbeBase):
  """The probe's cases of the run's settings, dtypes, outputs and locks (N1-N44)."""

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

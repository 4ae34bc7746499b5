"""The probe's cases of multi-process jobs, weight stores and Ray workers (N42-N66, N143, J12,
J14, J15)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

from probe_lib import (GRPO, REPO, SHAPES, TB, ProbeBase, Result, Tmpfs, _ckpts, _env, _free_port,
                       _rows, _wait, can_mount, first_error, grpo, metrics, run, verdict)


class JobCases(ProbeBase):
  """The cases of multi-process jobs, weight stores and Ray workers."""

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
    return verdict(r, error=r"must lie in \[0, (distributed.num_processes=)?2\)"), first_error(r)

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
      # a partial version (no manifest) is lost data; versions published before the disk
      # filled are complete and stay
      left = [n for n in os.listdir(f"{disk}/w") if n.startswith("v") and not os.path.exists(
          f"{disk}/w/{n}/manifest.json")] if os.path.isdir(f"{disk}/w") else []
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
    kills = len(re.findall(r"^(?:fleet|chaos): .*kill", r.err, flags=re.M))
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

"""The probe's cases of signals, the loss API and the first-use journeys (N121-N142, J1-J17)."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from typing import Callable

from probe_lib import (GRPO, REPO, SHAPES, ProbeBase, _ckpts, _rows, _wait, first_error, grpo, py,
                       run, verdict)


class ApiCases(ProbeBase):
  """The probe's cases of signals, the loss API and the first-use journeys (N121-N142, J1-J17)."""

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
    # 143 from a shell is -15 here (ended by the signal): either way nothing is lost
    return verdict(r, ok and r.rc in (0, 143, -signal.SIGTERM)), f"rc {r.rc}"

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
            "\"[h['reward_mean'] for h in result.run.history]\"))\nprint('RESULT', json.dumps(v))")
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
              "--sft_steps=5", f"--out_dir={out}", f"--export_hf={hf}"], steps=8, timeout=300)
    code = f"""
import numpy as np, jax
from jaxrl_sys.models import load_hf_checkpoint
_, a = load_hf_checkpoint({bf16!r}); _, b = load_hf_checkpoint({hf!r})
with np.load({out + '/final_params.npz'!r}) as z: trained = dict(z)
key = lambda kp: "/".join(str(getattr(k, "key", k)) for k in kp)
fa = {{key(kp): np.asarray(v) for kp, v in jax.tree_util.tree_flatten_with_path(a)[0]}}
fb = {{key(kp): np.asarray(v) for kp, v in jax.tree_util.tree_flatten_with_path(b)[0]}}
moved = sum(int((fa[k] != fb[k]).sum()) for k in fa)
trained_moved = sum(int((fa[k] != trained[k]).sum()) for k in fa)
kept = sum(int((fb[k] == trained[k]).sum()) for k in fa)
print("RESULT", moved, trained_moved, kept, sum(x.size for x in fa.values()))
"""
    c = py(code, timeout=200)
    res = next((s for s in c.err.splitlines() if s.startswith("RESULT")), "RESULT 0 0 0 1")
    moved, trained_moved, kept, total = map(int, res.split()[1:])
    # the export keeps the training: it equals the trained float32 masters, so it differs from
    # the input wherever training moved a parameter
    ok = r.rc == 0 and kept == total and moved == trained_moved and trained_moved > 0
    return verdict(r, ok), (f"rc {r.rc}: training moved {trained_moved} of {total} parameters; "
                            f"the export differs from the input in {moved}, equals the trained "
                            f"masters in {kept}")

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

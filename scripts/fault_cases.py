"""Reruns issue 30's new-user and fault cases on the CLI and prints a verdict table.

    PYTHONPATH=$PWD .venv/bin/python scripts/fault_cases.py [--only SUB[,SUB...]] [--rollout]

Each case runs `python -m experiments.grpo` (a subprocess, real signals and exit codes; the
tiny model and the test suite's shapes, so the compile cache serves it) or a few lines of
Python, under a time limit, and gets one verdict:

  ok            the run did what it should (outputs checked, not only the exit code)
  clear error   refused with a one-line `error:` naming the problem (exit 2), no traceback
  silent wrong  exit 0 (or the wrong exit code) while the outputs or the message are wrong
  traceback     a Python traceback reached the user
  data lost     outputs of a run (metrics rows, checkpoints, parameters) went missing
  hang          the time limit passed
  skipped       the case cannot run here (named with the reason)

`--rollout` adds the rollout-side cases (RolloutManager waits and weight checks through the
API, a corrupt tensorstore version under Ray workers, Ray addresses).
Not run by CI: about 25 minutes on 2 busy CPU cores (62 cases with --rollout).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

from fault_cases_rollout import RolloutCases
from fault_fixtures import write_data, write_hf_dirs
from fault_lib import (Result, Scratch, _ckpts, _free_port, _rows, _tb_purges, _wait, cli,
                       verdict_of)


class Cases(Scratch):
  """The cases, each a method returning (verdict, detail); `tmp` holds their files."""

  # ----- flags --------------------------------------------------------------------------------
  def error_cases(self) -> list[tuple[str, list[str], str]]:
    data = write_data(self.tmp)
    hf = write_hf_dirs(self.tmp)
    exp = self.d("export_full")
    os.makedirs(exp, exist_ok=True)
    open(os.path.join(exp, "keep.txt"), "w").write("x")
    cfg = self.d("bad.yaml")
    open(cfg, "w").write("learning_rat: 0.1\n")
    out = lambda n: f"--out_dir={self.d(n)}"  # noqa: E731
    return [
        ("--max_new_tokens=0", ["--max_new_tokens=0", out("e1")], "max_new_tokens=0 must be"),
        ("--weight_store=s3:/x with local rollout", ["--weight_store=s3:/x", out("e2")],
         "is for Ray workers"),
        ("--resume --overwrite", ["--resume", "--overwrite", out("e3")], "pass one of them"),
        ("--mesh=64x64 on CPU", ["--mesh=64x64", out("e4")], "faking more than 512"),
        ("--out_dir=/proc/self/x", ["--out_dir=/proc/self/x"], "cannot write there"),
        ("read-only --out_dir (/sys/x)", ["--out_dir=/sys/x"], "cannot write there"),
        ("read-only --checkpoint_dir", ["--checkpoint_dir=/sys/x", out("e5")],
         "cannot write there"),
        ("--max_prompt_len=100000", ["--max_prompt_len=100000", out("e6")], "needs at least"),
        ("prompts mostly longer than --max_prompt_len",
         [f"--task=jsonl:{data['long']}", "--max_prompt_len=16", out("e7")],
         r"row 0 \(\d+ tokens\): '0=9{78}'\.\.\."),
        ("non-UTF-8 data file", [f"--task=jsonl:{data['latin1']}", out("e8")],
         re.escape(data["latin1"]) + " line 2"),
        ("broken HF config.json", [f"--model={hf['broken_config']}", out("e9")],
         re.escape(hf["broken_config"]) + "/config.json: not valid JSON"),
        ("truncated safetensors", [f"--model={hf['truncated']}", out("e10")],
         re.escape(hf["truncated"]) + "/model.safetensors: truncated"),
        ("Qwen3 weights labelled Mistral", [f"--model={hf['mislabelled']}", out("e11")],
         r"unexpected tensor.*q_norm"),
        ("non-empty --export_hf (refused at start)", [f"--export_hf={exp}", out("e12")],
         "is not empty.*before training"),
        ("--algo=ppo", ["--algo=ppo", out("e13")], "unknown train.algo"),
        ("--mesh=8x", ["--mesh=8x", out("e14")], "bad mesh string"),
        ("--steps=0", ["--steps=0", out("e15")], "nothing to train"),
        ("--group_size=1", ["--group_size=1", out("e16")], "at least 2 samples"),
        ("--model=/nonexistent", ["--model=/nonexistent", out("e17")], "unknown model"),
        ("--task=jsonl:/nonexistent", ["--task=jsonl:/nonexistent", out("e18")],
         "does not exist"),
        ("--config with a misspelt key", [f"--config={cfg}", out("e19")], "did you mean"),
        ("--reward=nomod:f", [f"--task=jsonl:{data['sums']}", "--reward=nomod_x:f",
                              out("e20")], "cannot import module"),
        ("--resume without --out_dir", ["--resume"], "--resume needs the run"),
        ("1 MB prompt, --max_prompt_len=100000",
         [f"--task=jsonl:{data['huge']}", "--max_prompt_len=100000", out("e21")],
         "needs at least|longer than the context"),
        ("--ray_address with nothing listening",
         ["--rollout=ray", f"--ray_address=127.0.0.1:{_free_port()}", out("e22")],
         "no Ray cluster at --ray_address=127.0.0.1"),
        ("--rollout=ray --num_workers=0", ["--rollout=ray", "--num_workers=0", out("e23")],
         "needs rollout.num_workers >= 1"),
        ("--chaos_kill_every with local rollout", ["--chaos_kill_every=3", out("e24")],
         "act on Ray workers"),
        ("--preempt_trace=/nonexistent", ["--rollout=ray", "--preempt_trace=/nonexistent",
                                          out("e25")], "no such file"),
        ("--rollout.max_request_failures=-1", ["--rollout=ray",
                                               "--rollout.max_request_failures=-1", out("e26")],
         "max_request_failures must be >= 0"),
        ("empty data file", [f"--task=jsonl:{data['empty']}", out("e27")],
         re.escape(data["empty"])),
        ("data rows without a prompt field", [f"--task=jsonl:{data['noprompt']}", out("e28")],
         "prompt"),
        ("--max_prompt_len=0", ["--max_prompt_len=0", out("e29")], "max_prompt_len"),
        ("--export_hf that is a file", [f"--export_hf={data['sums']}", out("e30")],
         "is a file, not a directory"),
    ]

  # ----- runs ---------------------------------------------------------------------------------
  def baseline(self):
    out = self.d("base")
    r = cli(["--steps=2", f"--out_dir={out}"])
    ok = r.rc == 0 and _rows(out) == [1, 2] and os.path.exists(f"{out}/final_params.npz")
    return verdict_of(r, ok), f"rc {r.rc}, rows {_rows(out)}"

  def huge_prompt_default(self):
    out = self.d("huge")
    r = cli([f"--task=jsonl:{self.d('huge.jsonl')}", "--steps=1", f"--out_dir={out}"])
    ok = r.rc == 0 and "dropped 1 of 101 prompts" in r.err and len(r.err) < 5000
    return verdict_of(r, ok), f"rc {r.rc} in {r.seconds:.0f} s, dropped note: " + str(
        "dropped 1 of 101" in r.err)

  def rewards(self):
    mod = self.d("bad_reward.py")
    with open(mod, "w", encoding="utf-8") as f:
      f.write("def score(prompt, completion, answer, **row):\n"
              "  k = int(answer) % 5\n"
              "  return ['1.0', None, [1.0], 1e300, 0.5][k]\n")
    out = self.d("rewards")
    r = cli([f"--task=jsonl:{self.d('sums.jsonl')}", f"--reward={mod}:score", "--steps=2",
             f"--out_dir={out}"])
    rows = [json.loads(s) for s in open(f"{out}/metrics.jsonl")] if _rows(out) else []
    counted = sum(x.get("reward_failures", 0) for x in rows)
    ok = (r.rc == 0 and counted > 0 and "note: reward function failed" in r.err
          and "RewardValueError" in r.err and "diverged" not in r.err)
    return verdict_of(r, ok), f"rc {r.rc}, reward_failures counted {counted:.0f}"

  def huge_prompt_16(self):
    out = self.d("huge16")
    r = cli([f"--task=jsonl:{self.d('huge.jsonl')}", "--max_prompt_len=16", "--steps=1",
             f"--out_dir={out}"])
    ok = r.rc == 0 and "dropped 1 of 101 prompts" in r.err and len(r.err) < 5000
    return verdict_of(r, ok), f"rc {r.rc}, stderr {len(r.err)} chars"

  def reward_values(self):
    """(name, verdict, detail) for a reward function returning each bad value on every row."""
    got = []
    for i, (label, value) in enumerate([("str", "'x'"), ("list", "[1.0]"), ("None", "None"),
                                        ('"1.0"', "'1.0'"), ("1e300", "1e300")]):
      mod = self.d(f"reward_{i}.py")
      with open(mod, "w", encoding="utf-8") as f:
        f.write(f"def score(prompt, completion, answer, **row):\n  return {value}\n")
      out = self.d(f"reward_{i}")
      r = cli([f"--task=jsonl:{self.d('sums.jsonl')}", f"--reward={mod}:score", "--steps=1",
               f"--out_dir={out}"])
      rows = [json.loads(x) for x in open(f"{out}/metrics.jsonl")] if _rows(out) else []
      counted = sum(x.get("reward_failures", 0) for x in rows)
      ok = (r.rc == 0 and counted == 16 and "note: reward function failed" in r.err
            and "RewardValueError" in r.err and "diverged" not in r.err)
      got.append((f"reward returning {label}", verdict_of(r, ok),
                  f"rc {r.rc}, reward_failures {counted:.0f} of 16"))
    return got

  def sigterm(self):
    out = self.d("term")

    def act(p):
      _wait(lambda: _ckpts(out), p)
      p.send_signal(signal.SIGTERM)
    r = cli(["--steps=400", "--save_every=2", f"--out_dir={out}"], signals=act)
    ok = r.rc == 0 and "preempted" in r.err and _ckpts(out) and _ckpts(out)[-1] == _rows(out)[-1]
    return verdict_of(r, ok, lost=not _ckpts(out)), f"rc {r.rc}, checkpoints {_ckpts(out)}"

  def sigint(self):
    out = self.d("int")

    def act(p):
      _wait(lambda: _ckpts(out), p)
      p.send_signal(signal.SIGINT)
    r = cli(["--steps=400", "--save_every=2", f"--out_dir={out}"], signals=act)
    lines = [s for s in r.err.splitlines() if s.startswith("interrupted")]
    ok = (r.rc == 130 and len(lines) == 1 and _ckpts(out)[-1:] == _rows(out)[-1:]
          and os.path.exists(f"{out}/final_params.npz"))
    lost = not _ckpts(out) or not os.path.exists(f"{out}/final_params.npz")
    return verdict_of(r, ok, lost=lost), f"rc {r.rc}, checkpoints {_ckpts(out)}"

  def sigint_mid_save(self):
    out = self.d("int_save")
    caught = []

    def saving():
      d = os.path.join(out, "checkpoints")
      names = os.listdir(d) if os.path.isdir(d) else []
      return any("tmp" in n for n in names) and _ckpts(out)

    def act(p):
      caught.append(_wait(saving, p))
      p.send_signal(signal.SIGINT)
    r = cli(["--steps=400", "--save_every=1", f"--out_dir={out}"], signals=act)
    half = [n for n in os.listdir(f"{out}/checkpoints") if "tmp" in n]
    ok = (r.rc == 130 and not half and _ckpts(out)[-1:] == _rows(out)[-1:]
          and os.path.exists(f"{out}/final_params.npz") and caught[0])
    lost = not _ckpts(out) or bool(half) or not os.path.exists(f"{out}/final_params.npz")
    return verdict_of(r, ok, lost=lost), (f"rc {r.rc}, signal during a save: {caught[0]}, "
                                          f"checkpoints {_ckpts(out)[-3:]}, rows to "
                                          f"{(_rows(out) or [0])[-1]}")

  def shared_checkpoint_dir(self):
    out, ckpt = self.d("ck_a"), self.d("ck_shared")
    second: list[Result] = []

    def act(p):
      _wait(lambda: os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt)), p)
      second.append(cli(["--steps=2", f"--checkpoint_dir={ckpt}", f"--out_dir={self.d('ck_b')}"]))
      p.send_signal(signal.SIGTERM)
    r = cli(["--steps=400", "--save_every=2", f"--checkpoint_dir={ckpt}", f"--out_dir={out}"],
            signals=act)
    refused = verdict_of(second[0], False, error=r"--checkpoint_dir=.* is in use by the running "
                                                 r"job of pid \d+")
    steps = sorted(int(n) for n in os.listdir(ckpt) if n.isdigit())
    rows = _rows(out)
    intact = bool(steps) and steps[-1:] == rows[-1:] and not os.path.exists(f"{ckpt}/.lock")
    ok = r.rc == 0 and intact and refused == "clear error"
    return verdict_of(r, ok, lost=not intact), (f"second run: {refused}; first: checkpoints "
                                                f"{steps[-2:]}, {len(rows)} rows, lock released "
                                                f"{not os.path.exists(f'{ckpt}/.lock')}")

  def sigint_twice(self):
    out = self.d("int")  # continues the run above

    def act(p):
      start = (_ckpts(out) or [0])[-1]
      _wait(lambda: (_ckpts(out) or [0])[-1] >= start + 2, p)
      p.send_signal(signal.SIGINT)
      time.sleep(0.3)
      p.send_signal(signal.SIGINT)
    r = cli(["--steps=400", "--save_every=2", f"--out_dir={out}", "--resume"], signals=act)
    half = [d for d in os.listdir(f"{out}/checkpoints") if "tmp" in d]
    ok = r.rc == 130 and not half and not os.path.exists(f"{out}/.lock")
    detail = f"rc {r.rc} in {r.seconds:.0f} s, half-written {half}"
    return verdict_of(r, ok, lost=bool(half)), detail

  def overwrite_live_run(self):
    out = self.d("live")
    second: list[Result] = []

    def act(p):
      _wait(lambda: _ckpts(out), p)
      second.append(cli(["--steps=2", "--overwrite", f"--out_dir={out}"]))
      p.send_signal(signal.SIGTERM)  # then end the first run
    r = cli(["--steps=400", "--save_every=2", f"--out_dir={out}"], signals=act)
    refused = verdict_of(second[0], False, error=r"in use by the running job of pid \d+")
    rows = _rows(out)
    intact = bool(rows) and rows == list(range(1, len(rows) + 1)) and _ckpts(out)[-1:] == rows[-1:]
    ok = r.rc == 0 and intact and refused == "clear error"
    return verdict_of(r, ok, lost=not intact), f"second run: {refused}; first: {len(rows)} rows"

  def sigkill_resume(self):
    out = self.d("kill")

    def act(p):
      _wait(lambda: len(_ckpts(out)) >= 2, p)
      p.kill()
    cli(["--steps=400", "--save_every=1", "--mode=async", "--max_staleness=1",
         f"--out_dir={out}"], signals=act)
    last = _ckpts(out)[-1]
    r = cli([f"--steps={last + 3}", "--save_every=1", "--mode=async", "--max_staleness=1",
             f"--out_dir={out}", "--resume"])
    purges = _tb_purges(os.path.join(out, "tb"))
    ok = (r.rc == 0 and _rows(out) == list(range(1, last + 4)) and "reclaimed a stale lock" in r.err
          and purges == [last + 1])
    return verdict_of(r, ok), (f"rc {r.rc}, rows unique: {len(set(_rows(out))) == len(_rows(out))}"
                               f", TensorBoard purge at steps {purges} (resumed at {last})")

  def resume_cases(self):
    """(name, verdict, detail) for the resume cases on one finished run."""
    out = self.d("res")
    base = ["--steps=4", "--save_every=1", f"--out_dir={out}"]
    cli(base)
    got = []
    r = cli(["--steps=4", "--save_every=1", f"--out_dir={out}", "--resume"])
    got.append(("--resume at the last step", verdict_of(r, r.rc == 0 and "step 4/4" in r.err),
                f"rc {r.rc}"))
    r = cli(["--steps=2", f"--out_dir={out}", "--resume"])
    got.append(("--resume --steps below the run's step", verdict_of(
        r, False, error="--steps=2 is below step 4"), f"rc {r.rc}"))
    r = cli(["--steps=5", "--save_every=1", "--learning_rate=0.002", f"--out_dir={out}",
             "--resume"])
    cfg = json.load(open(f"{out}/config.json"))
    changed = (cfg.get("history") or [{}])[-1].get("changed", {})
    ok = (r.rc == 0 and any(k.endswith("learning_rate") for k in changed)
          and "learning_rate 0.001 -> 0.002" in r.err)
    got.append(("--resume with another --learning_rate", verdict_of(r, ok),
                f"history records {sorted(changed)}"))
    newest = f"{out}/checkpoints/{_ckpts(out)[-1]}/meta/metadata"
    open(newest, "w").write("{torn")
    r = cli(["--steps=6", "--save_every=1", f"--out_dir={out}", "--resume"])
    got.append(("corrupt newest checkpoint + --resume", verdict_of(
        r, r.rc == 0 and "unreadable" in r.err and _rows(out) == list(range(1, 7))),
        f"rc {r.rc}, rows {_rows(out)}"))
    for s in _ckpts(out):
      open(f"{out}/checkpoints/{s}/meta/metadata", "w").write("{torn")
    r = cli(["--steps=8", f"--out_dir={out}", "--resume"])
    got.append(("all checkpoints corrupt + --resume", verdict_of(
        r, False, error="every checkpoint in .* is unreadable"),
        f"rc {r.rc}, 'Event loop is closed' x{r.err.count('Event loop is closed')}"))
    return got


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", default="", help="run the cases whose name contains one of these "
                  "comma-separated substrings")
  ap.add_argument("--rollout", action="store_true", help="add the rollout-side cases")
  ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
  args = ap.parse_args()
  parts = [x for x in args.only.split(",") if x]
  want = lambda name: not parts or any(x in name for x in parts)  # noqa: E731
  tmp = tempfile.mkdtemp(prefix="fault_cases_")
  cases = Cases(tmp)
  table: list[tuple[str, str, str]] = []

  def record(name, verdict, detail):
    table.append((name, verdict, detail))
    print(f"{verdict:13s} {name}: {detail}", file=sys.stderr, flush=True)

  try:
    for name, flags, error in cases.error_cases():
      if want(name):
        r = cli(flags, timeout=120)
        first = next((s for s in r.err.splitlines() if s.startswith("error:")), "")
        record(name, verdict_of(r, False, error=error), f"rc {r.rc}: {first[:110]}")
    runs = [("baseline G", cases.baseline), ("1 MB prompt, default --max_prompt_len",
                                              cases.huge_prompt_default),
            ("rewards: '1.0', None, list, 1e300", cases.rewards), ("SIGTERM", cases.sigterm),
            ("1 MB prompt, --max_prompt_len=16", cases.huge_prompt_16),
            ("SIGINT", cases.sigint), ("second SIGINT", cases.sigint_twice),
            ("SIGINT mid-save", cases.sigint_mid_save),
            ("--overwrite on a live run", cases.overwrite_live_run),
            ("--checkpoint_dir of a live run", cases.shared_checkpoint_dir),
            ("SIGKILL + --resume", cases.sigkill_resume)]
    for name, fn in runs:
      if want(name):
        record(name, *fn())
    if want("reward returning"):
      for row in cases.reward_values():
        record(*row)
    if want("--resume"):
      for row in cases.resume_cases():
        record(*row)
    if args.rollout:
      for row in RolloutCases(tmp).rollout_cases(want):
        record(*row)
  finally:
    if not args.keep:
      shutil.rmtree(tmp, ignore_errors=True)
  width = max(len(n) for n, _, _ in table)
  print(f"\n{'case':{width}s}  verdict        detail")
  for name, verdict, detail in table:
    print(f"{name:{width}s}  {verdict:13s}  {detail}")
  counts: dict[str, int] = {}
  for _, verdict, _ in table:
    counts[verdict] = counts.get(verdict, 0) + 1
  print("\n" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" ({len(table)} cases)")
  return 0


if __name__ == "__main__":
  sys.exit(main())

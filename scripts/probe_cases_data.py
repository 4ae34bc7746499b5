"""The probe's cases of rewards, data files and the simulator (N67-N120, J9)."""
from __future__ import annotations

import json
import re

from probe_lib import (SIM, ProbeBase, _rows, first_error, grpo, metrics, run, verdict)


class DataCases(ProbeBase):
  """The probe's cases of rewards, data files and the simulator (N67-N120, J9)."""

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
                           args=["--eval_every=1", "--eval_prompts=100"], error=r"eval.prompts")

  def case_n93(self):
    """N93 data: --eval_prompts=-5"""
    return self._data_case("n93", self._rows_text(self._sum_rows()),
                           args=["--eval_every=1", "--eval_prompts=-5"], error=r"eval.prompts")

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
    t = self._trace("n95", "10,add,a\n5,add,b\n")  # <ms>,<action>,<node>
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
    t = self._trace("n101", "0,remove,a\n10,remove,b\n")
    return self._sim("n101", [f"--trace={t}"], r"not live")

  def case_n102(self):
    """N102 sim: ISO counts trace with a line going back"""
    t = self._trace("n102", "timestamp,count\n2024-01-01T00:00:00,2\n2024-01-01T01:00:00,3\n"
                    "2024-01-01T00:30:00,1\n2024-01-01T02:00:00,2\n")
    # the counts format's documented rule (trace_formats): a line going back in time drops the
    # points after it; the run then completes (it ended in a traceback before)
    r = run([*SIM, f"--out_dir={self.d('n102')}", f"--trace={t}"], timeout=150)
    return verdict(r, r.rc == 0, error=None if r.rc == 0 else r"back|baseline"), first_error(r)

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
    t = self.write("n106.json", json.dumps({"metadata": {"gap_seconds": 60}, "data": []}))
    return self._sim("n106", [f"--trace={t}", "--trace_format=skypilot"], r"nothing to replay",
                     codes=(1, 2))

  def case_n107(self):
    """N107 sim: a bamboo file with --trace_format=parcae"""
    t = self._trace("n107", "0,add,a\n10,add,b\n")
    return self._sim("n107", [f"--trace={t}", "--trace_format=parcae"],
                     r"parcae|expected \[ms, action")

  def case_n108(self):
    """N108 sim: --trace_format=xml"""
    return self._sim("n108", ["--trace_format=xml"], r"xml", codes=(1, 2))

  def case_n109(self):
    """N109 sim: --trace_time_scale=1e12 --segments=0"""
    # it hung; finishing (a trace replayed that slowly stays as it starts) or a clear refusal of
    # the scale is fine
    r = run([*SIM, f"--out_dir={self.d('n109')}", "--trace_time_scale=1e12", "--segments=0"],
            timeout=120)
    return verdict(r, r.rc == 0, error=None if r.rc == 0 else r"trace_time_scale"), (
        first_error(r))

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
    return self._sim("n115", ["--segment_hours=0"], r"must be (a finite number )?> 0",
                     codes=(1, 2))

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

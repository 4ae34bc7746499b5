"""`python -m experiments.spot_sim` with bad flags and bad traces: each is one line on stderr and
exit status 2, quickly (never a traceback or a hang); a run that fails is named and the runs
that finished are kept; large count-series and SpotServe traces run to completion."""
import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs spot_sim.main in one process for many argument lists (one interpreter start for all the
# cases): prints [[exit status, stderr], ...] as JSON. A traceback escaping main is recorded.
_DRIVER = r"""
import contextlib, io, json, sys, traceback
from absl import flags
from experiments import spot_sim
out = []
for args in json.loads(sys.argv[1]):
  flags.FLAGS.unparse_flags()
  err = io.StringIO()
  try:
    argv = flags.FLAGS(["spot_sim", *args])
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
      code = spot_sim.main(argv)
  except Exception:  # noqa: BLE001
    code, err = "traceback", io.StringIO(traceback.format_exc())
  out.append([code, err.getvalue()])
print(json.dumps(out))
"""


def _cases(tmp_path):
  def trace(name, text):
    path = tmp_path / name
    path.write_text(text)
    return f"--trace={path}"

  out = f"--out_dir={tmp_path / 'out'}"
  fast = ["--preset=qwen3-8b", "--settings=rlboost", "--jobs=1", "--plots=false", out]
  return [
      # (arguments, what the one line must say)
      ([trace("empty.csv", ""), *fast], "the trace is empty; known formats"),
      ([trace("back.csv", "60000,add,a\n0,add,b\n"), *fast], "back.csv:2: time goes backwards"),
      ([trace("neg.csv", "0,2\n60,-3\n"), *fast], "neg.csv:2: negative count -3"),
      ([trace("half.csv", "0,2\n60,1.5\n"), *fast], "half.csv:2: expected '<timestamp>,<count>' "
                                                    "with a whole-number count"),
      ([trace("act.csv", "0,add,a\n60000,remov,a\n"), *fast], "act.csv:2: unknown action"),
      ([trace("huge.csv", "0,1\n60,1e9\n"), *fast], "huge.csv:2: 1,000,000,000 instances live"),
      ([trace("sky.json", '{"metadata": {"gap_seconds": -60}, "data": [1]}'), *fast],
       "gap_seconds must be a finite number > 0"),
      ([f"--trace={tmp_path / 'missing.csv'}", *fast], "missing.csv: no such file"),
      ([trace("many.csv", "0,300\n7200,300\n"), *fast],
       "makes up to 300 spot instances available at once; the simulator runs at most 256"),
      (["--trace_time_scale=1e12", *fast], "segments of 2 h, more than the 1000 one run covers"),
      (["--trace_time_scale=0", *fast], "--trace_time_scale must be a finite number > 0"),
      (["--trace_time_scale=nan", *fast], "--trace_time_scale must be a finite number > 0"),
      (["--length_median=-5", *fast], "--length_median must be a finite number > 0"),
      (["--length_sigma=-1", *fast], "--length_sigma must be a finite number >= 0"),
      (["--group_share=2", *fast], "response lengths (--length_median, --length_sigma, "
                                   "--group_share): LengthDistribution: need"),
      (["--settings=rlbost", "--preset=qwen3-8b", out], "unknown settings ['rlbost']; known:"),
      (["--preset=qwen3-9b", "--settings=rlboost"], "unknown model preset 'qwen3-9b'"),
      (["--preset=measured:/nonexistent", "--settings=rlboost"],
       "/nonexistent/generate.json not found"),
      (["--segments=99", *fast], "no segment [99]: the trace has 5 segment(s) of 2 h"),
      (["--segment_hours=1000", *fast], "longer than the 168 h one run simulates"),
      (["--sample=1.5", *fast], "--sample must be in [0, 1]"),
      (["--jobs=0", "--settings=rlboost", out], "--jobs must be >= 1"),
  ]


def test_every_bad_flag_and_trace_is_one_line_and_exit_2(tmp_path):
  cases = _cases(tmp_path)
  out = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps([a for a, _ in cases])],
                       cwd=_REPO, capture_output=True, text=True, timeout=120, check=True)
  results = json.loads(out.stdout.splitlines()[-1])
  for (args, want), (code, err) in zip(cases, results):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, code, err)
    assert want in lines[0], (args, want, lines[0])


def test_the_command_line_exit_status_and_a_single_line(tmp_path):
  # As a user runs it (absl's app.run turns main's return value into the exit status).
  out = subprocess.run([sys.executable, "-m", "experiments.spot_sim",
                        f"--trace={tmp_path / 'nope.csv'}", f"--out_dir={tmp_path}"],
                       cwd=_REPO, capture_output=True, text=True, timeout=60)
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [
      f"error: trace {tmp_path / 'nope.csv'}: no such file"], out.stderr


def _count_series(path, lo, hi, minutes=120):
  """A count-series trace of a large zone: `lo`..`hi` instances, one line a minute (the
  skypilot/counts form of public availability logs)."""
  lines = ["timestamp,count"] + [f"{60 * i},{lo + (7 * i) % (hi - lo + 1)}"
                                 for i in range(minutes + 1)]
  path.write_text("\n".join(lines) + "\n")


def test_large_zone_and_spotserve_traces_run_to_completion_with_the_colocated_baseline(tmp_path):
  # 54-64 instances available (a zone of dozens): every run ends with a result, no pull fails
  # (a pull is never late for a healthy simulated store), the fleet stays within N_prem.
  big = tmp_path / "zone.csv"
  _count_series(big, 54, 64)
  serve = tmp_path / "trace_seg.txt"
  serve.write_text('[0, "add", {"nodes": ["a", "b", "c", "d"]}]\n'
                   '[900000, "remove", {"nodes": ["b"]}]\n'
                   '[1800000, "add", {"nodes": ["e", "f"]}]\n'
                   '[3600000, "DONE", {"nodes": []}]\n')
  for trace, out in ((big, tmp_path / "zone"), (serve, tmp_path / "serve")):
    res = subprocess.run(
        [sys.executable, "-m", "experiments.spot_sim", "--preset=qwen3-8b",
         "--settings=rlboost", f"--trace={trace}", "--max_steps=2", "--jobs=1",
         "--length_median=1500", "--plots=false", f"--out_dir={out}"],
        cwd=_REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "[2/2]" in res.stdout and "avail: spot instances the trace makes available" in \
        res.stdout
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["setting"] for r in runs} == {"colocated", "rlboost"}
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["sample"] == 1.0  # a trace of one's own is not sampled by default
    rl = next(r["result"] for r in results["runs"] if r["setting"] == "rlboost")
    assert len(rl["steps"]) == 2 and rl["counters"].get("pull_failures", 0) == 0
    cap = 4  # Algorithm 1's cap starts at N_resv (4 local engines on one 8xH100 node)
    for s in rl["steps"]:  # a step's fleet stays within the cap it ran under
      assert s["remote_live"] <= cap, (s["remote_live"], cap)
      cap = s["n_prem_cap"]
    if trace == big:
      assert 54 <= rl["spot_available"] <= 64 and rl["spot_used"] <= rl["spot_available"]

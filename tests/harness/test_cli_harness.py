"""`python -m experiments.grpo` as a user runs it: own data and reward (a subprocess), config
files, run directories, divergence, bad input (the command's `main` in this process:
`tests/experiments/cli_runner.py`); tiny model, the shared test shapes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from jaxrl_sys.train.recipe import config_file
from tests.experiments.cli_runner import run_grpo
from tests.experiments.test_grpo_cli import BASE, REPO, _env, _params

SHAPES = [a for a in BASE if not a.startswith(("--sft_steps", "--progress"))]


def _cli(args, env=None, timeout=400):
  p = subprocess.run([sys.executable, "-m", "experiments.grpo", "--progress=false", *args],
                     cwd=REPO, env=env or _env(), capture_output=True, text=True,
                     timeout=timeout)
  return p.returncode, p.stderr


ARITH_REWARD = '''import re

def score(prompt, completion, answer, **row):
  """1 when the completion starts with the exact integer answer."""
  with open(LOG, "a") as f:
    f.write(prompt + "\\n")
  m = re.match(r"\\s*(-?\\d+)", completion)
  return float(m is not None and m.group(1) == str(answer))
'''


def test_jsonl_task_with_module_reward_learns(tmp_path):
  """A user's JSONL prompts + `module:function` reward on the tiny model: the training reward
  rises, evaluation runs on the held-out rows only, and the outputs are listed. The suite's
  one learning test (supervised warm-up, then GRPO through the loop a user runs); each CPU run
  is deterministic, and the gain needed (0.1) is ~3.5 standard deviations of the difference of
  two 10-step windows."""
  rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
  rng = np.random.default_rng(0)
  rows = [rows[i] for i in rng.permutation(len(rows))]
  data = tmp_path / "sums.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  log = tmp_path / "prompts.log"
  (tmp_path / "arith_reward.py").write_text(f"LOG = {str(log)!r}\n" + ARITH_REWARD)
  env = _env()
  env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
  out = tmp_path / "run"
  rc, err = _cli(SHAPES + [f"--task=jsonl:{data}", "--reward=arith_reward:score",
                           "--steps=60", "--prompts_per_step=64", "--lr_warmup_steps=5",
                           "--eval_every=20", "--eval_prompts=20", f"--out_dir={out}"], env=env)
  assert rc == 0, err
  hist = [json.loads(line) for line in open(out / "metrics.jsonl")]
  rewards = [h["reward_mean"] for h in hist]
  print(f"train reward first10 {np.mean(rewards[:10]):.3f} last10 {np.mean(rewards[-10:]):.3f}")
  # 640 Bernoulli samples per 10-step window: std of a window mean <= 0.02.
  assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 0.1
  assert [h["step"] for h in hist if "eval_reward" in h] == [20, 40, 60]
  held_out = {r["prompt"] for r in rows[-20:]}
  scored = log.read_text().split()
  # 3 evaluations x 20 held-out prompts x 4 samples, and never a held-out prompt in training
  assert sum(p in held_out for p in scored) == 3 * 20 * 4
  assert all(h["reward_failures"] == 0 for h in hist)
  assert "outputs:" in err and "metrics.jsonl (60 rows)" in err and "reward_kl.png" in err
  first = err.splitlines()[:2]  # said at the start: what loads, then where the outputs go
  assert first[0].startswith("loading model 'tiny'") and first[1] == f"run directory: {out}"
  assert ("precision: masters + moments float32, compute float32, rollout float32, gradient "
          "sums float32") in err  # the policy, named at start-up ("auto" = float32 on a CPU)


def test_config_file_round_trip(tmp_path):
  cfg = {"steps": 2, "seed": 3, "learning_rate": 0.002, "sft_steps": 0, "group_size": 4,
         "prompts_per_step": 4, "micro_batch_groups": 16, "max_new_tokens": 4,
         "lr_warmup_steps": 0, "kl_coef": None}
  (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
  rc, err = run_grpo(["--progress=false", f"--config={tmp_path / 'c.yaml'}",
                      f"--out_dir={tmp_path / 'a'}"])
  assert rc == 0, err
  written = config_file.short_names(json.load(open(tmp_path / "a" / "config.json")))
  assert {k: written[k] for k in cfg} == cfg
  assert "out_dir" not in written and "checkpoint_dir" not in written
  # the command line wins over the file (which says steps: 2)
  rc, err = run_grpo([f"--config={tmp_path / 'a' / 'config.json'}", "--steps=0",
                      f"--out_dir={tmp_path / 'c'}"])
  assert rc == 2 and "loop.steps=0: nothing to train" in err, err
  rc, err = run_grpo(["--progress=false", f"--config={tmp_path / 'a' / 'config.json'}",
                      f"--out_dir={tmp_path / 'b'}"])
  assert rc == 0, err
  a, b = _params(tmp_path / "a"), _params(tmp_path / "b")
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_reused_out_dir_is_refused_then_overwritten(tmp_path):
  out = tmp_path / "run"
  args = ["--progress=false", *SHAPES, "--steps=1", "--sft_steps=0", f"--out_dir={out}"]
  assert run_grpo(args)[0] == 0
  rc, err = run_grpo(args)
  assert rc == 2 and "already holds a run" in err and "--overwrite" in err, err
  rc, err = run_grpo(args + ["--overwrite", "--steps=2"])
  assert rc == 0, err
  steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
  assert steps == [1, 2]  # the first run's rows are gone, not mixed in


def test_divergence_exits_nonzero_and_never_done(tmp_path):
  rc, err = run_grpo(["--progress=false", *SHAPES, "--steps=30", "--learning_rate=1e6",
                      "--prompts_per_step=64", "--lr_warmup_steps=5",
                      f"--out_dir={tmp_path / 'run'}"])
  assert rc == 3, err
  assert "error: training diverged at step" in err and "done" not in err, err


@pytest.mark.parametrize("args,message", [
    (["--steps=0"], "loop.steps=0: nothing to train"),
    (["--sft_steps=-5"], "warmup.steps=-5 must be >= 0"),
    (["--out_dir={file}"], "is a file, not a directory"),
    (["--checkpoint_dir={file}"], "is a file, not a directory"),
    (["--model={empty}"], "not a usable Hugging Face model"),
    (["--task=jsonl:{file}"], "not a JSON object"),
    (["--config={file}"], "cannot parse it"),
    (["--resume"], "--resume needs the run to continue"),
])
def test_bad_input_is_one_clear_line(tmp_path, args, message):
  f = tmp_path / "afile"
  f.write_text("not json")
  os.makedirs(tmp_path / "empty")
  args = [a.format(file=f, empty=tmp_path / "empty") for a in args]
  if not args[0].startswith(("--out_dir", "--resume")):  # never write into the repository
    args.append(f"--out_dir={tmp_path / 'o'}")
  rc, err = run_grpo(args)
  assert rc == 2, err
  assert message in err and "Traceback" not in err, err


def test_early_mesh_size_reads_the_config_file(tmp_path):
  from experiments.grpo import _early_mesh_size
  (tmp_path / "c.json").write_text('{"mesh": "2x4"}')
  assert _early_mesh_size([f"--config={tmp_path / 'c.json'}"]) == 8
  assert _early_mesh_size(["--mesh=2x2", f"--config={tmp_path / 'c.json'}"]) == 4
  assert _early_mesh_size(["--mesh=8x"]) is None

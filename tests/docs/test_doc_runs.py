"""The docs' commands that train, run as written (paths in a temporary directory, fewer
steps where `tests/docs/commands.py` says so), in this process: `python -m experiments.grpo`
through its own flags and `main` (`tests/experiments/cli_runner.py`), other `python -m` modules
through `runpy` with their `sys.argv`, `python -c` through `exec`. A new interpreter per
command would spend ~5 CPU-s on imports (torch and transformers for the Hugging Face ones)
before it does the command's work; the commands as processes are the CLI tests' subject."""
import os
import re
import runpy
import shlex
import sys

from tests.docs.commands import REPO, module_args
from tests.experiments.cli_runner import run_grpo


def _run(args, cwd):
  """Runs `python <args>` in this process with `cwd` as the working directory; returns what
  an `experiments.grpo` run wrote to stderr ("" for other commands, which must not raise)."""
  old_cwd, old_argv = os.getcwd(), sys.argv
  os.chdir(cwd)
  try:
    if args[:2] == ["-m", "experiments.grpo"]:
      code, err = run_grpo(args[2:])
      assert code == 0, err[-3000:]
      return err
    if args[0] == "-m":
      sys.argv = [args[1], *args[2:]]
      runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
      assert args[0] == "-c", args
      sys.argv = ["-c", *args[2:]]
      exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
    return ""
  finally:
    sys.argv = old_argv
    os.chdir(old_cwd)


def test_quickstart_main_job_with_eval(tmp_path):
  """`bash scripts/quickstart.sh` ends in `python -m experiments.grpo "$@"` (after the install
  CI does with scripts/test.sh): the main job with its defaults, here 2 steps with the
  README's periodic evaluation."""
  with open(os.path.join(REPO, "scripts", "quickstart.sh")) as f:
    assert f.read().rstrip().endswith('exec .venv/bin/python -m experiments.grpo "$@"')
  args = module_args("python -m experiments.grpo --steps=20 --eval_every=10", "experiments.grpo")
  err = _run(["-m", "experiments.grpo", *args, "--steps=2", "--eval_every=2",
              "--progress=false", f"--out_dir={tmp_path / 'run'}"], cwd=REPO)
  assert re.search(r"done: step 2/2, reward [\d.]+, eval reward [\d.]+", err), err
  for name in ("metrics.jsonl", "reward_kl.png", "config.json", "final_params.npz"):
    assert (tmp_path / "run" / name).exists(), name


def test_hf_model_train_export_and_load(tmp_path):
  """The three commands of "A Hugging Face model" (README and docs/hf_and_tasks.md), in
  order, with /tmp/tiny-qwen3 and runs/hf-demo moved into a temporary directory."""
  subst = lambda c: c.replace("/tmp/tiny-qwen3", str(tmp_path / "tiny-qwen3")).replace(
      "runs/hf-demo", str(tmp_path / "hf-demo"))
  cmds = [
      "python -m examples.make_tiny_hf_model /tmp/tiny-qwen3",
      "python -m experiments.grpo --model=/tmp/tiny-qwen3 --steps=5 --prompts_per_step=8 "
      "--out_dir=runs/hf-demo --export_hf=runs/hf-demo/hf",
      "python -c \"import transformers; "
      "transformers.AutoModelForCausalLM.from_pretrained('runs/hf-demo/hf')\"",
  ]
  for cmd in cmds:
    args = shlex.split(subst(cmd))
    assert args[0] == "python"
    extra = ["--progress=false"] if "experiments.grpo" in cmd else []
    err = _run([*args[1:], *extra], cwd=tmp_path)
    if "experiments.grpo" in cmd:
      assert "done: step 5/5" in err and "hf export" in err, err
  assert (tmp_path / "hf-demo" / "hf" / "tokenizer.json").exists()

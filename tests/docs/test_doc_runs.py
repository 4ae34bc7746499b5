"""The docs' commands that train, run as written (paths in a temporary directory, fewer
steps where `tests/docs/commands.py` says so)."""
import os
import re
import shlex
import subprocess
import sys

from tests.docs.commands import REPO, module_args


def _run(args, cwd, timeout=400):
  p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                     env=dict(os.environ, PYTHONPATH=REPO))
  assert p.returncode == 0, p.stderr[-3000:]
  return p.stderr


def test_quickstart_main_job_with_eval(tmp_path):
  """`bash scripts/quickstart.sh` ends in `python -m experiments.grpo "$@"` (after the install
  CI does with scripts/test.sh): the main job with its defaults, here 2 steps with the
  README's periodic evaluation."""
  with open(os.path.join(REPO, "scripts", "quickstart.sh")) as f:
    assert f.read().rstrip().endswith('exec .venv/bin/python -m experiments.grpo "$@"')
  args = module_args("python -m experiments.grpo --steps=20 --eval_every=10", "experiments.grpo")
  err = _run([sys.executable, "-m", "experiments.grpo", *args, "--steps=2", "--eval_every=2",
              "--progress=false", f"--compile_cache={os.path.join(REPO, '.jax_cache')}",
              f"--out_dir={tmp_path / 'run'}"], cwd=REPO)
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
    err = _run([sys.executable, *args[1:], *extra], cwd=tmp_path)
    if "experiments.grpo" in cmd:
      assert "done: step 5/5" in err and "hf export" in err, err
  assert (tmp_path / "hf-demo" / "hf" / "tokenizer.json").exists()

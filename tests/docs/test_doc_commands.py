"""Every shell command of README.md and docs/*.md is exercised: run here, or run by the test
its `COVERAGE` entry names; the flags of every `experiments.*` command are parsed by the real
absl parser, so a renamed flag breaks the docs' test, not the user."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.docs.commands import (CI, COVERAGE, REPO, External, Mapped, Run, doc_commands,
                                 module_args, normalize)

DOCS = doc_commands()


def test_every_doc_command_has_an_entry():
  assert len(DOCS) >= 20
  entries = {normalize(k) for k in COVERAGE}
  assert sorted(set(DOCS) - entries) == [], "doc commands without a COVERAGE entry"
  assert sorted(entries - set(DOCS)) == [], "COVERAGE entries no doc shows any more"
  for name in ("experiments.md", "losses.md", "hf_and_tasks.md", "ray.md", "checkpoints.md",
               "simulator.md"):
    assert os.path.exists(os.path.join(REPO, "docs", name)), name


@pytest.mark.parametrize("command", sorted(COVERAGE))
def test_entry_names_a_test_that_exists(command):
  entry = COVERAGE[command]
  if isinstance(entry, (Run, Mapped)):
    path, name = entry.test.split("::")
    with open(os.path.join(REPO, path)) as f:
      assert re.search(rf"^def {name}\(", f.read(), flags=re.M), entry.test
  elif isinstance(entry, CI):
    with open(os.path.join(REPO, ".ci", "run")) as f:
      assert "exec bash scripts/test.sh" in f.read()
  else:
    assert isinstance(entry, External)


_PARSE = r"""
import copy, importlib, json, sys
mod = importlib.import_module(sys.argv[1])
out = []
for argv in json.loads(sys.argv[2]):
  fv = copy.deepcopy(mod.FLAGS)
  try:
    fv([sys.argv[1]] + argv)
    out.append({k: fv[k].value for k in {a[2:].split("=")[0] for a in argv}})
  except Exception as e:  # absl's UnrecognizedFlagError / IllegalFlagValueError
    out.append(f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""


def _parse(module: str) -> dict[str, dict]:
  cmds = [c for c in DOCS if module_args(c, module) not in (None, ["--helpfull"])]
  argvs = [module_args(c, module) for c in cmds]
  p = subprocess.run([sys.executable, "-c", _PARSE, module, json.dumps(argvs)], cwd=REPO,
                     capture_output=True, text=True, timeout=120, check=True)
  return dict(zip(cmds, json.loads(p.stdout.splitlines()[-1])))


def test_grpo_doc_commands_parse():
  parsed = _parse("experiments.grpo")
  assert len(parsed) >= 15
  for cmd, values in parsed.items():
    assert isinstance(values, dict), f"{cmd}: {values}"
  for cmd, values in parsed.items():  # inputs the commands name exist in the repository
    for key in ("preempt_trace", "config"):
      path = values.get(key)
      if path and not path.startswith("runs/"):  # runs/: written by the command before
        assert os.path.exists(os.path.join(REPO, path)), f"{cmd}: {path}"
    task = values.get("task") or ""
    if task.startswith("jsonl:"):
      assert os.path.exists(os.path.join(REPO, task[6:])), cmd
  # The config file the docs use holds flag names only.
  import yaml  # pylint: disable=import-outside-toplevel
  from experiments import grpo  # pylint: disable=import-outside-toplevel
  with open(os.path.join(REPO, "examples", "grpo_sums.yaml")) as f:
    assert [k for k in yaml.safe_load(f) if k not in grpo.FLAGS] == []


def test_spot_sim_doc_commands_parse():
  parsed = _parse("experiments.spot_sim")
  assert len(parsed) == 4
  for cmd, values in parsed.items():
    assert isinstance(values, dict), f"{cmd}: {values}"


@pytest.mark.parametrize("command", [c for c, e in COVERAGE.items() if isinstance(e, External)])
def test_external_commands_options(command):
  entry = COVERAGE[command]
  tool = entry.tool.split()
  exe = os.path.join(os.path.dirname(sys.executable), tool[0])
  out = subprocess.run([exe, *tool[1:], "--help"], capture_output=True, text=True, timeout=120,
                       check=True).stdout
  for option in entry.options:
    assert option in command and re.search(rf"{option}\b", out), option


def _sh(args, cwd=REPO, timeout=300, **kw):
  p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)
  assert p.returncode == 0, p.stderr[-3000:]
  return p.stdout + p.stderr


def test_cheap_commands_run(tmp_path):
  out = _sh(["head", "-2", "examples/sums.jsonl"])
  rows = [json.loads(line) for line in out.splitlines()]
  assert len(rows) == 2 and all({"prompt", "answer"} <= set(r) for r in rows)

  p = subprocess.run([sys.executable, "-m", "experiments.grpo", "--helpfull"], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  out = p.stdout
  assert p.returncode in (0, 1) and "experiments/grpo.py:" in out, p.stderr  # absl exits 1
  for flag in ("--rollout", "--ray_address", "--weight_store", "--export_hf", "--resume"):
    assert flag in out

  args = module_args("python -m experiments.spot_sim --preset=qwen3-14b "
                     "--settings=rlboost,restart --segments=0", "experiments.spot_sim")
  out = _sh([sys.executable, "-m", "experiments.spot_sim", *args, "--max_steps=2", "--jobs=1",
             f"--out_dir={tmp_path / 'sim'}"])
  assert "qwen3-14b: RLBoost vs co-located veRL" in out and "restart from prompt" in out

"""The side-by-side comparison with TRL and Tunix (`benchmarks/peers`) is not run here (the
peers' installs, minutes per run): its driver's dry run names every step it would take, and
the peers' scripts parse their arguments (they import the peers only after that)."""
import os
import subprocess
import sys

from tests.docs.commands import REPO


def _run(*argv):
  p = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                     timeout=60, check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  return p.stdout


def test_the_driver_dry_run_names_every_step_and_runs_none(tmp_path):
  work = tmp_path / "peers"
  out = _run("-m", "benchmarks.peers.compare", "--dry-run", "--runs=2", f"--workdir={work}")
  lines = [line for line in out.splitlines() if line.startswith("$ ")]
  assert sum("-m venv" in line for line in lines) == 2  # one environment per peer
  assert any("torch==2.13.0" in line for line in lines)
  assert any("google-tunix==0.1.7" in line for line in lines)
  assert sum("make_tiny_model.py" in line for line in lines) == 2  # dense and MoE
  for script in ("trl_grpo.py", "tunix_grpo.py", "benchmarks.peers.compare --ours"):
    assert sum(script in line for line in lines) == 4, script  # 2 runs x 2 models
  assert not work.exists()
  locked = _run("-m", "benchmarks.peers.compare", "--dry-run", "--locked", "--frameworks=ours",
                f"--workdir={work}")
  assert "requirements-trl.txt" in locked and "tunix" not in locked


def test_the_peer_scripts_parse_their_arguments():
  for script, flag in (("trl_grpo.py", "--model"), ("tunix_grpo.py", "--model"),
                       ("make_tiny_model.py", "--arch")):
    assert flag in _run(os.path.join("benchmarks", "peers", script), "--help"), script

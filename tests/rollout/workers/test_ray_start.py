"""Ray start-up never hangs: an address with nothing listening fails within seconds with a
message that says what to do, from Python and from the CLI (no traceback); "auto" with no
cluster is the same kind of error."""
import os
import socket
import subprocess
import sys
import time

import pytest

from jaxrl_sys.rollout.workers.ray import RayUnavailableError, check_ray_address
from tests.experiments.test_grpo_cli import _run

ROOT = __file__.rsplit("/tests/", 1)[0]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_an_address_with_nothing_listening_fails_at_once():
  port = _free_port()
  t0 = time.monotonic()
  with pytest.raises(RayUnavailableError, match=rf"no Ray cluster at --ray_address=127.0.0.1:"
                     rf"{port}: .*Connection refused.*ray start --head --port={port}"):
    check_ray_address(f"127.0.0.1:{port}")
  with pytest.raises(RayUnavailableError, match=rf"ray://127.0.0.1:{port}"):
    check_ray_address(f"ray://127.0.0.1:{port}")
  assert time.monotonic() - t0 < 12.0
  check_ray_address("auto")  # not a host:port: left to Ray


def test_cli_with_an_unreachable_ray_address_is_a_clear_error(tmp_path):
  port = _free_port()
  t0 = time.monotonic()
  rc, _, err = _run(["--rollout=ray", "--num_workers=2", f"--ray_address=127.0.0.1:{port}",
                     "--steps=1", "--prompts_per_step=8", "--sft_steps=0",
                     f"--out_dir={tmp_path}"], timeout=240)
  assert rc == 2, err
  assert f"error: no Ray cluster at --ray_address=127.0.0.1:{port}" in err, err
  assert "Traceback" not in err, err
  assert time.monotonic() - t0 < 200


def test_auto_without_a_cluster_is_a_clear_error(tmp_path):
  # Checked when the test runs, not at collection: another test may start a cluster meanwhile.
  import psutil  # pylint: disable=import-outside-toplevel
  if any("gcs_server" in (p.info["name"] or "") for p in psutil.process_iter(["name"])):
    pytest.skip("a Ray cluster runs on this machine (another test's): 'auto' would find it")
  code = ("from jaxrl_sys.rollout.workers.ray import init_ray, RayUnavailableError\n"
          "try:\n  init_ray('auto')\nexcept RayUnavailableError as e:\n  print('ERR', e)\n")
  env = dict(os.environ, RAY_TMPDIR=str(tmp_path))
  env.pop("RAY_ADDRESS", None)
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120, check=False)
  assert res.returncode == 0 and "ERR could not start or reach Ray (auto)" in res.stdout, (
      res.stdout + res.stderr[-2000:])
  assert "--ray_address" in res.stdout and "Traceback" not in res.stderr

"""`python -m experiments.grpo` as a subprocess: preemption, crash recovery, big meshes, errors."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxrl_sys.train import recipe as recipe_lib
from tests.docs.commands import REPO
from tests.experiments.cli_runner import CACHE, run_grpo
from tests.train.common import quick

# Same shapes as tests/train (shared compile cache): tiny model, no warm-up.
BASE = ["--prompts_per_step=4", "--group_size=4", "--micro_batch_groups=16", "--sft_steps=0",
        "--lr_warmup_steps=0", "--max_new_tokens=4", "--progress=false", CACHE]


def _env(devices=8):
  """The test session's environment (same XLA flags: compile-cache keys include them), with
  the CPU device count replaced."""
  env = dict(os.environ)
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _start(args, devices=8):
  return subprocess.Popen([sys.executable, "-m", "experiments.grpo", *BASE, *args], cwd=REPO,
                          env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def _run(args, devices=8, timeout=300):
  p = _start(args, devices)
  out, err = p.communicate(timeout=timeout)
  return p.returncode, out, err


def _committed_steps(ckpt_dir):
  return sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit()
                and os.path.exists(os.path.join(ckpt_dir, d, "_CHECKPOINT_METADATA")))


def _wait_for(pred, proc, timeout=240):
  t0 = time.monotonic()
  while time.monotonic() - t0 < timeout:
    if pred():
      return True
    if proc.poll() is not None:
      return False
    time.sleep(0.02)
  raise TimeoutError("condition not reached")


def _params(out_dir):
  with np.load(os.path.join(out_dir, "final_params.npz")) as z:
    return {k: z[k] for k in z.files}


def test_sigterm_then_resume_is_bit_exact(tmp_path):
  steps = ["--steps=16", "--save_every=2"]
  # The uninterrupted reference, in this process (same programs, same XLA flags).
  recipe_lib.run_recipe(recipe_lib.build_recipe(quick(steps=16, out_dir=str(tmp_path / "ref"))))
  ck = str(tmp_path / "ck")
  p = _start(steps + [f"--out_dir={tmp_path / 'a'}", f"--checkpoint_dir={ck}"])
  assert _wait_for(lambda: os.path.isdir(ck) and any(d[0].isdigit() for d in os.listdir(ck)), p)
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=120)
  assert p.returncode == 0, err
  assert "preempted" in err, err
  saved = _committed_steps(ck)
  assert saved and saved[-1] < 16
  # The resume: the command's main in this process (the same flags; saves an interpreter).
  rc, err = run_grpo([*BASE, *steps, f"--out_dir={tmp_path / 'b'}", f"--checkpoint_dir={ck}",
                      "--resume"])
  assert rc == 0, err
  assert f"resumed from step {saved[-1]}" in err, err
  ref, got = _params(tmp_path / "ref"), _params(tmp_path / "b")
  assert ref.keys() == got.keys()
  for k in ref:
    np.testing.assert_array_equal(got[k], ref[k], err_msg=k)


def _buffer_groups(ckpt_dir, step):
  path = os.path.join(ckpt_dir, str(step), "meta", "metadata")
  with open(path) as f:
    buf = json.load(f)["host"]["buffer"]
  groups = {g["group_id"] for g in buf["groups"]}
  groups |= {r["group_id"] for r in buf["partials"]}
  return groups


def test_sigkill_resumes_from_last_checkpoint_without_losing_the_buffer(tmp_path):
  ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
  args = ["--steps=40", "--save_every=1", "--mode=async", "--max_staleness=1",
          f"--checkpoint_dir={ck}", f"--out_dir={out}"]
  p = _start(args)
  assert _wait_for(lambda: os.path.isdir(ck) and len(_committed_steps(ck)) >= 2, p)
  p.kill()
  p.communicate(timeout=60)
  last = _committed_steps(ck)[-1]
  assert last < 40
  buffered = _buffer_groups(ck, last)
  assert buffered, "async mode with eta=1 keeps groups in flight at a step boundary"
  rc, err = run_grpo([*BASE, *args[:1], "--steps=%d" % (last + 4), *args[1:], "--resume"])
  assert rc == 0, err
  assert f"resumed from step {last}" in err, err
  assert "reclaimed a stale lock" in err and f"pid {p.pid}" in err, err  # the killed run's
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  trained_after = {g for r in rows[-4:] for g in r["group_ids"]}
  # steps logged after the last checkpoint were replayed: one row each, the replayed one
  assert [r["step"] for r in rows] == list(range(1, last + 5))
  assert buffered <= trained_after, buffered - trained_after


def test_mesh_8x4_on_32_fake_devices(tmp_path):
  rc, _, err = _run(["--mesh=8x4", "--steps=1", "--prompts_per_step=8",
                     f"--out_dir={tmp_path}"], devices=32)
  assert rc == 0, err
  assert "done: step 1/1" in err, err


@pytest.mark.parametrize("flag,message", [
    ("--mesh=8x", "bad mesh string '8x'"),
    ("--algo=ppo", "unknown train.algo 'ppo'"),
    ("--behav_weight_cap=0", "train.behav_weight_cap=0.0 must be > 0"),
])
def test_cli_rejects_bad_input(tmp_path, flag, message):
  rc, err = run_grpo([*BASE, flag, "--steps=1", f"--out_dir={tmp_path}"])
  assert rc != 0
  assert message in err, err

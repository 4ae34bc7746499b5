"""`experiments.grpo --rollout=ray` end to end as a user runs it, and the error for a worker
that can never start."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_sys.rollout.elastic.trace_formats import bundled_trace
from jaxrl_sys.rollout.setup.ray import check_ray_resources
from jaxrl_sys.rollout.setup.spec import RolloutSetup
from jaxrl_sys.train import recipe as recipe_lib
from tests.docs.commands import REPO
from tests.experiments.test_grpo_cli import (BASE, _committed_steps, _env, _params, _run,
                                             _wait_for)
from tests.train.common import quick



def test_worker_asking_for_missing_resources_is_a_clear_error(ray_session):  # pylint: disable=unused-argument
  with pytest.raises(ValueError, match=r"asks for GPU=1 but the Ray cluster has 0 GPUs.*"
                                       r"lower rollout.worker_gpus"):
    check_ray_resources(RolloutSetup(rollout="ray", worker_gpus=1))
  with pytest.raises(ValueError, match="rollout.weight_store=memory only serves in-process"):
    RolloutSetup(rollout="ray", weight_store="memory")
  with pytest.raises(ValueError, match="act on Ray workers: use them with rollout.rollout=ray"):
    RolloutSetup(chaos_kill_every=3.0)


def test_cli_ray_workers_with_chaos_and_adaptive_offload(tmp_path, ray_session):
  """A job that joins a running Ray cluster (`--ray_address=HOST:PORT`, docs/ray.md's
  multi-node form; here the session's instance) and starts none of its own: its actors run
  there, and the trace preempts them."""
  trace = bundled_trace("parcae/trace_ll_10_11.txt")
  address = ray_session.get_runtime_context().gcs_address
  rc, _, err = _run(["--steps=4", "--rollout=ray", "--num_workers=2", "--offload=adaptive",
                     "--t_seed_init=0.2", f"--preempt_trace={trace}", "--trace_time_scale=0.05",
                     f"--ray_address={address}", f"--out_dir={tmp_path}"], timeout=400)
  assert rc == 0, err
  assert "done: step 4/4" in err, err
  assert os.path.exists(tmp_path / "offload.png")
  # Ray's own start-up lines: the job joined the cluster and started no instance of its own.
  assert "Connecting to existing Ray cluster" in err and "Started a local Ray" not in err, err


def test_chaos_run_survives_a_process_group_sigterm_and_resumes_exactly(tmp_path):
  """README's chaos command (docs/ray.md), with the weights published as files, ended by a
  SIGTERM to its whole process group after step 1 (what SLURM and Kubernetes send). Issue 44:
  Ray's own processes got the signal too, the trainer hung on the lost GCS and wrote no
  checkpoint; kills faster than a worker starts livelocked the run. Now Ray runs in its own
  session: the step finishes, the checkpoint is written, exit 0; kills print one line each
  (and pause while no worker has finished starting); `--resume` continues to the same
  parameters as an undisturbed in-process run."""
  # the command's 4, less one: each step under these kills takes a minute or more; the SIGTERM
  # comes after step 1, so it lands in step 2 and leaves step 3 to the resume (with 2 steps it
  # could land in the last one, which then finishes the run)
  steps = 3
  ref = tmp_path / "ref"
  recipe_lib.run_recipe(recipe_lib.build_recipe(quick(steps=steps, prompts_per_step=8,
                                                      out_dir=str(ref))), messages=False)
  current = "/tmp/ray/ray_current_cluster"  # what a plain ray.init() on this machine would join
  before = open(current).read() if os.path.exists(current) else None
  store, out = tmp_path / "weights", tmp_path / "run"
  args = ["--rollout=ray", "--num_workers=2", "--chaos_kill_every=3", "--worker_token_delay=0.5",
          f"--steps={steps}", "--prompts_per_step=8", "--save_every=100",
          f"--weight_store=tensorstore:{store}", f"--out_dir={out}"]
  p = subprocess.Popen([sys.executable, "-m", "experiments.grpo", *BASE, *args], cwd=REPO,
                       env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       start_new_session=True)
  rows = lambda: [json.loads(x) for x in open(out / "metrics.jsonl")] if os.path.exists(  # noqa: E731
      out / "metrics.jsonl") else []
  try:
    started = _wait_for(lambda: len(rows()) >= 1, p, timeout=400)
  except TimeoutError:
    started = False
  if not started:
    os.killpg(p.pid, signal.SIGKILL)
    pytest.fail("no step within 400 s:\n" + p.communicate()[1][-4000:])
  os.killpg(p.pid, signal.SIGTERM)
  _, err = p.communicate(timeout=300)
  assert p.returncode == 0, err[-3000:]
  assert "preempted (checkpoint saved)" in err, err[-3000:]
  saved = _committed_steps(out / "checkpoints")
  assert saved and saved[-1] < steps, (saved, err[-2000:])
  assert any(d.startswith("v") for d in os.listdir(store))
  rc, _, err2 = _run([*args, "--resume"], timeout=400)
  assert rc == 0, err2[-3000:]
  assert f"resumed from step {saved[-1]}" in err2, err2[-3000:]
  # every step of the two runs, each with all of its groups (8 prompts x 4)
  got = rows()
  assert sorted({r["step"] for r in got}) == list(range(1, steps + 1)), got
  assert all(r["num_sequences"] == 32 for r in got), got
  lines = [x for x in (err + err2).splitlines() if x.startswith("fleet: ")]
  assert any(x.startswith("fleet: killed ") for x in lines), (err + err2)[-3000:]
  assert any(" joined (serving weight version" in x for x in lines), lines
  # the run's own Ray head (its own session) did not make itself the machine's default cluster
  assert (open(current).read() if os.path.exists(current) else None) == before
  ours, want = _params(out), _params(ref)
  assert ours.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(ours[k], want[k], err_msg=k)

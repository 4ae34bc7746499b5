"""`experiments.grpo --rollout=ray` end to end as a user runs it, and the error for a worker
that can never start."""
import json
import os

import pytest

from jaxrl_sys.rollout.elastic.trace_formats import bundled_trace
from jaxrl_sys.rollout.setup.ray import check_ray_resources
from jaxrl_sys.rollout.setup.spec import RolloutSetup
from tests.experiments.test_grpo_cli import _run



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


def test_cli_chaos_workers_and_a_file_weight_store(tmp_path):
  """README's chaos command (docs/ray.md), as written, with the weights published as files."""
  store = tmp_path / "weights"
  rc, _, err = _run(["--rollout=ray", "--num_workers=2", "--chaos_kill_every=8", "--steps=4",
                     "--prompts_per_step=8", f"--weight_store=tensorstore:{store}",
                     f"--out_dir={tmp_path / 'run'}"], timeout=400)
  assert rc == 0, err
  assert "done: step 4/4" in err, err
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert len(rows) == 4 and all(r["weight_pulls"] >= 1 for r in rows)
  assert any(d.startswith("v") for d in os.listdir(store))

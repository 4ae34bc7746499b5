"""An MoE policy's routes survive SIGTERM and `--resume` of `python -m experiments.grpo`.

Asynchronous mode (eta 1) keeps the next step's groups in the buffer at step boundaries, so
checkpoints hold finished, not yet trained responses with their routes; a resumed run trains on
them with the routes replayed (R3). Those responses were sampled by older weights than the ones
that train on them, so routing them live would pick other experts for some tokens: only the
recorded routes reproduce the uninterrupted run. References: the request invariant (one route
per fed position, checked as the checkpoint is read back) and an uninterrupted run in this
process (the final parameters, bit for bit).
"""
import json
import os
import signal

import numpy as np
import pytest

from jaxrl_sys.rollout.wire import request_from_json
from jaxrl_sys.train import recipe as recipe_lib
from tests.experiments.cli_runner import run_grpo
from tests.experiments.test_grpo_cli import BASE, _committed_steps, _params, _start, _wait_for
from tests.train.common import quick

ARGS = ["--model=tiny_moe", "--mode=async", "--max_staleness=1", "--steps=6", "--save_every=1",
        "--local_workers=1"]


def _saved_requests(ckpt_dir, step):
  with open(os.path.join(ckpt_dir, str(step), "meta", "metadata")) as f:
    buf = json.load(f)["host"]["buffer"]
  return ([request_from_json(d["request"]) for g in buf["groups"] for d in g["done"]]
          + [request_from_json(r) for r in buf["partials"]])


@pytest.mark.slow
def test_moe_routes_survive_sigterm_and_resume(tmp_path):
  recipe_lib.run_recipe(recipe_lib.build_recipe(quick(
      model="tiny_moe", mode="async", max_staleness=1, steps=6, local_workers=1,
      out_dir=str(tmp_path / "ref"))))
  ck = str(tmp_path / "ck")
  p = _start(ARGS + [f"--out_dir={tmp_path / 'a'}", f"--checkpoint_dir={ck}"])
  assert _wait_for(lambda: os.path.isdir(ck) and _committed_steps(ck), p)
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=120)
  assert p.returncode == 0 and "preempted" in err, err
  saved = _committed_steps(ck)
  assert saved[-1] < 6
  reqs = [r for s in saved for r in _saved_requests(ck, s) if r.num_generated]
  assert reqs, "async mode buffers finished, untrained responses at step boundaries"
  for r in reqs:   # read back through the invariant: one route per fed position
    assert r.routes.dtype == np.uint8
    assert r.routes.shape == (len(r.prompt) + r.num_generated - 1, 2, 2)
  rc, err = run_grpo([*BASE, *ARGS, f"--out_dir={tmp_path / 'b'}", f"--checkpoint_dir={ck}",
                      "--resume"])
  assert rc == 0, err
  assert f"resumed from step {saved[-1]}" in err, err
  rows = [json.loads(line) for line in open(tmp_path / "b" / "metrics.jsonl")]
  assert all(r["route_bytes"] > 0 and 0.5 < r["moe/replay_agreement_mean"] <= 1.0 for r in rows)
  ref, got = _params(tmp_path / "ref"), _params(tmp_path / "b")
  for k in ref:
    np.testing.assert_array_equal(got[k], ref[k], err_msg=k)

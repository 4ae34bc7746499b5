"""Resume that cannot lose work, and the divergence guard (in-process runs, tiny model)."""
import json
import os

import jax
import numpy as np
import pytest

from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.loop.checkpoint import Checkpointer
from jaxrl_sys.train.loop.compat import CheckpointMismatchError
from jaxrl_sys.train.loop.config import CheckpointConfig
from jaxrl_sys.train.loop.guard import DivergenceError
from tests.train.common import quick


def _run(resume=False, **kw):
  return recipe_lib.run_recipe(recipe_lib.build_recipe(quick(progress=False, **kw)),
                               resume=resume)


def _steps(ckpt_dir):
  return sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())


def test_resume_with_another_model_names_the_fields_and_keeps_checkpoints(tmp_path):
  out = str(tmp_path / "run")
  _run(steps=2, out_dir=out)
  ck = os.path.join(out, "checkpoints")
  before = sorted(os.listdir(ck))
  config_before = open(os.path.join(out, "config.json")).read()
  assert _steps(ck) == [1, 2]
  with pytest.raises(CheckpointMismatchError) as e:
    _run(resume=True, steps=4, out_dir=out, model="tiny_moe")
  assert "model: checkpoint 'tiny', this run 'tiny_moe'" in str(e.value)
  assert "corrupt" not in str(e.value)
  with pytest.raises(CheckpointMismatchError, match=r"seed: checkpoint 0, this run 7"):
    _run(resume=True, steps=4, out_dir=out, seed=7)
  assert sorted(os.listdir(ck)) == before  # nothing renamed aside
  assert open(os.path.join(out, "config.json")).read() == config_before


def test_layout_mismatch_without_identity_is_not_corruption(tmp_path):
  """An older checkpoint with no recorded identity is still told apart from corruption by the
  shapes it stores."""
  out = str(tmp_path / "run")
  rec = recipe_lib.build_recipe(quick(steps=1, out_dir=out, progress=False))
  rec.checkpoint = CheckpointConfig(directory=os.path.join(out, "ck"), identity=None)
  recipe_lib.run_recipe(rec)
  other = recipe_lib.build_recipe(quick(steps=2, out_dir=out, progress=False,
                                        model="tiny_moe"))
  other.checkpoint = CheckpointConfig(directory=os.path.join(out, "ck"), identity=None)
  with pytest.raises(CheckpointMismatchError, match=r"\['moe_state'\]\.bias: not in the "
                                                    r"checkpoint"):
    recipe_lib.run_recipe(other, resume=True)
  assert _steps(os.path.join(out, "ck")) == [1]


def test_nothing_to_resume_says_so_and_resume_message_comes_first(tmp_path, capsys):
  out = str(tmp_path / "run")
  result = _run(resume=True, steps=1, out_dir=out)
  err = capsys.readouterr().err
  assert "nothing to resume" in err and result.run.resumed_from is None
  # corrupt the newest checkpoint of a 2-step run: the fallback is announced before step 3
  out2 = str(tmp_path / "run2")
  _run(steps=2, out_dir=out2)
  ck = os.path.join(out2, "checkpoints")
  meta = os.path.join(ck, "2", "meta", "metadata")
  with open(meta, "w") as f:
    f.write("{not json")
  capsys.readouterr()
  rec = recipe_lib.build_recipe(quick(steps=3, out_dir=out2, progress=False))
  seen = []
  rec.task.metrics_hook = lambda step, state, row: seen.append(capsys.readouterr().err)
  result = recipe_lib.run_recipe(rec, resume=True)
  assert result.run.resumed_from == 1 and len(result.run.history) == 2
  assert "checkpoint at step 2 is unreadable" in seen[0] and "resumed from step 1" in seen[0]
  assert any(d.startswith("corrupt_2") for d in os.listdir(ck))


# The reported divergence: learning rate 1e6 on the default batch (64 prompts) after the
# warm-up; the loss turns non-finite within a few steps (deterministic on CPU).
DIVERGE = dict(learning_rate=1e6, prompts_per_step=64, sft_steps=60, lr_warmup_steps=5)


def _finite(tree):
  return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tree))


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  out = str(tmp_path / "run")
  with pytest.raises(DivergenceError) as e:
    _run(steps=30, out_dir=out, **DIVERGE)
  bad = e.value.step
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  assert rows[-1]["step"] == bad and not np.isfinite(rows[-1]["loss"] + rows[-1]["grad_norm"])
  assert all(np.isfinite(r["loss"]) for r in rows[:-1])
  ck = os.path.join(out, "checkpoints")
  assert _steps(ck) and _steps(ck)[-1] == bad - 1 == e.value.last_checkpoint
  assert f"last good checkpoint is step {bad - 1}" in str(e.value)
  assert not os.path.exists(os.path.join(out, "final_params.npz"))
  rec = recipe_lib.build_recipe(quick(steps=30, out_dir=out, progress=False))
  from jaxrl_sys.train.step.programs import train_programs
  from jaxrl_sys.train.step.state import state_shardings, with_shardings
  plan, mesh = rec.plan, recipe_lib.recipe_mesh(rec.mesh_spec)
  optimizer, _, abstract, _ = train_programs(plan.train_model, plan.train,
                                             plan.precision.param_dtype, mesh)
  target = with_shardings(abstract, state_shardings(abstract, plan.train_model, optimizer, mesh))
  ckpt = Checkpointer(CheckpointConfig(directory=ck))
  got = ckpt.restore(target)
  ckpt.close()
  assert got.step == bad - 1 and _finite(got.state.params)


def test_skip_nonfinite_drops_updates_then_stops(tmp_path):
  with pytest.raises(DivergenceError, match="10 consecutive updates skipped") as e:
    _run(steps=40, out_dir=str(tmp_path / "run"), skip_nonfinite=True, save_every=0, **DIVERGE)
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  skipped = [r for r in rows if r["update_skipped"]]
  assert len(skipped) == 10 and rows[-1]["step"] == e.value.step
  # a skipped update applies nothing: the optimizer's update is exactly zero
  assert all(r["update_norm"] == 0.0 for r in skipped)
  assert all(np.isfinite(r["loss"]) for r in rows if not r["update_skipped"])

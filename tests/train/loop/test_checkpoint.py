"""Checkpoints: round trip, restore onto another mesh, fallback from a corrupt latest step."""
import logging
import os

import jax
import numpy as np
import pytest

from jaxrl_sys.rollout.types import Completion, FinishReason, Request, request_key
from jaxrl_sys.sharding import make_mesh
from jaxrl_sys.train.loop.buffer import RolloutBuffer
from jaxrl_sys.train.loop.checkpoint import Checkpointer
from jaxrl_sys.train.step.config import train_config_for_algo
from jaxrl_sys.train.loop.config import CheckpointConfig
from jaxrl_sys.train.step.optim import make_optimizer
from jaxrl_sys.train.recipe.presets import load_model
from jaxrl_sys.train.step.state import (abstract_state, init_train_state, state_shardings,
                                        with_shardings)
from tests.precision_helpers import needs_devices

MC = load_model("tiny", max_seq_len=12).config  # the shapes of the other trainer tests
TC = train_config_for_algo("grpo")  # KL > 0: the state carries a reference copy
OPT = make_optimizer(TC.optim)


def _host(tree):
  return jax.tree.map(np.asarray, tree)


def _buffer():
  buf = RolloutBuffer(samples_per_group=2)
  buf.add_group(7, version=1)
  r = Request(14, np.array([1, 5, 6], np.int32), 4, request_key(0, 14), group_id=7,
              tokens=[3, 2], logprobs=[-0.5, -0.25], versions=[1, 1])
  buf.record([Completion(r, FinishReason.STOP)])
  buf.partials.append(Request(15, np.array([1, 5, 6], np.int32), 4, request_key(0, 15),
                              group_id=7, tokens=[4], logprobs=[-1.5], versions=[1]))
  return buf


def _target(mesh):
  abstract = abstract_state(MC, TC, OPT)
  return with_shardings(abstract, state_shardings(abstract, MC, OPT, mesh))


@needs_devices(8)
def test_round_trip_other_mesh_and_buffer(tmp_path):
  mesh = make_mesh("2x4")
  state = init_train_state(MC, TC, OPT, mesh=mesh, seed=3)
  state = state._replace(step=state.step + 5)
  ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path), keep=2))
  ckpt.save(state, {"next_prompt": 11, "buffer": _buffer().to_json()})
  ckpt.close()

  for shape in ("1x1", "4x2"):
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path), keep=2))
    got = ckpt.restore(_target(make_mesh(shape)))
    ckpt.close()
    assert got.step == 5 and got.host["next_prompt"] == 11
    assert got.state.params["embed"].sharding.mesh.shape == make_mesh(shape).shape
    jax.tree.map(np.testing.assert_array_equal, _host(got.state), _host(state))
  buf = RolloutBuffer.from_json(got.host["buffer"])
  ref = _buffer()
  assert buf.to_json() == ref.to_json()
  np.testing.assert_array_equal(buf.partials[0].logprobs, ref.partials[0].logprobs)


def _corrupt(step_dir):
  """Overwrites the bytes of every data file of the state item (keeps sizes)."""
  n = 0
  for root, _, files in os.walk(os.path.join(step_dir, "state")):
    for f in files:
      p = os.path.join(root, f)
      if "ocdbt" in root or f.startswith("d"):
        size = os.path.getsize(p)
        with open(p, "r+b") as fh:
          fh.write(os.urandom(max(size, 1)))
        n += 1
  assert n


@pytest.mark.parametrize("how", ["garbage", "truncate"])
def test_corrupt_latest_falls_back(tmp_path, caplog, how):
  mesh = make_mesh("1x1")
  state = init_train_state(MC, TC, OPT, mesh=mesh, seed=0)
  ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path), keep=3, async_save=False))
  states = {}
  for step in (1, 2):
    state = state._replace(step=state.step + 1,
                           params=jax.tree.map(lambda p: p + 1.0, state.params))
    states[step] = _host(state)
    ckpt.save(state, {"step": step})
  ckpt.close()
  step_dir = os.path.join(tmp_path, "2")
  if how == "garbage":
    _corrupt(step_dir)
  else:
    for root, _, files in os.walk(os.path.join(step_dir, "state")):
      for f in files:
        if "manifest" in f or f.startswith("d") or "ocdbt" in root:
          with open(os.path.join(root, f), "r+b") as fh:
            fh.truncate(max(os.path.getsize(os.path.join(root, f)) // 3, 0))
  ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path), keep=3))
  with caplog.at_level(logging.WARNING):
    got = ckpt.restore(_target(mesh))
  assert got is not None and got.step == 1
  jax.tree.map(np.testing.assert_array_equal, _host(got.state), states[1])
  assert "corrupt" in caplog.text
  # the bad step was moved aside: saving step 2 again works
  assert ckpt.all_steps() == [1]
  assert ckpt.save(got.state._replace(step=got.state.step + 1), {})
  ckpt.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_is_one_clear_error_and_leaves_no_partial_step(tmp_path, caplog):
  """Issue 44: orbax on a full disk logged ~30 stacks and left N.orbax-checkpoint-tmp."""
  from jaxrl_sys.train.loop.checkpoint import CheckpointSaveError  # pylint: disable=import-outside-toplevel
  from tests.full_disk import full_disk  # pylint: disable=import-outside-toplevel
  state = init_train_state(MC, TC, OPT, mesh=make_mesh("1x1"), seed=0)
  with full_disk(tmp_path / "disk") as disk:
    ckpt = Checkpointer(CheckpointConfig(directory=os.path.join(disk, "ck"), keep=2))
    with caplog.at_level(logging.WARNING), pytest.raises(
        CheckpointSaveError, match=r"saving checkpoint 0 in .*/ck failed: the disk is full .* "
                                   "no checkpoint was written"):
      ckpt.save(state, {"next_prompt": 0})
      ckpt.wait()
    ckpt.close()  # reported once
    assert os.listdir(os.path.join(disk, "ck")) == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

"""The embedded rollout's engines: how many, and that splitting them changes no sample."""
import dataclasses
import os

import numpy as np
import pytest

from jaxrl_sys.rollout import InProcessWorker, ThreadWorker
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.loop.config import LoopConfig
from jaxrl_sys.train.loop.local_client import default_client, local_worker_count
from tests.precision_helpers import per_backend
from tests.train.common import quick


def test_local_worker_count_auto_and_explicit():
  auto = LoopConfig()
  # a CPU host of 2+ cores: two engines of 32 slots; an accelerator: one engine
  assert local_worker_count(auto, 64) == per_backend(cpu=2 if (os.cpu_count() or 1) >= 2 else 1,
                                                     gpu=1)
  assert local_worker_count(auto, 63) == 1          # fewer than 32 slots each: one engine
  assert local_worker_count(LoopConfig(local_workers=3), 64) == 3
  assert local_worker_count(LoopConfig(local_workers=8), 4) == 4   # at most one per slot


def test_default_client_splits_the_slots_over_thread_workers():
  recipe = recipe_lib.build_recipe(quick(local_workers=2))
  mc, lc = recipe.model.config, recipe.loop
  eos = recipe.model.tokenizer.eos_id
  one = default_client(mc, recipe.model.params, dataclasses.replace(lc, local_workers=1), eos, 0,
                       lc.group_size)
  two = default_client(mc, recipe.model.params, lc, eos, 0, lc.group_size)
  [w1] = [ws.worker for ws in one.workers.values()]
  ws2 = [ws.worker for ws in two.workers.values()]
  assert isinstance(w1, InProcessWorker) and all(isinstance(w, ThreadWorker) for w in ws2)
  assert [w.server.engine_config.num_slots for w in ws2] == [
      w1.server.engine_config.num_slots // 2] * 2
  one.close()
  two.close()


def test_two_local_engines_train_on_the_samples_one_engine_draws():
  """Tokens are a function of the request key and index: two engines draw the very samples one
  engine draws, so the rewards are equal and the losses equal up to float reassociation."""
  runs = [recipe_lib.run_recipe(recipe_lib.build_recipe(quick(steps=2, local_workers=n)))
          for n in (1, 2)]
  (a, b) = [[(h["reward_mean"], h["response_len_mean"], h["loss"], h["kl"]) for h in r.history]
            for r in runs]
  np.testing.assert_array_equal(np.array(a)[:, :2], np.array(b)[:, :2])
  np.testing.assert_allclose(np.array(a)[:, 2:], np.array(b)[:, 2:], rtol=1e-4, atol=1e-6)


def test_a_bad_preempt_trace_fails_before_ray_starts(tmp_path, monkeypatch):
  from jaxrl_sys.rollout.workers import ray as ray_worker  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.recipe.rollout_setup import RolloutSetup  # pylint: disable=import-outside-toplevel

  def no_ray(*a, **k):
    raise AssertionError("Ray was started before the trace was checked")

  monkeypatch.setattr(ray_worker, "init_ray", no_ray)
  bad = tmp_path / "avail.log"
  bad.write_text("instance i-1 up at noon\n")
  with pytest.raises(ValueError, match=r"--preempt_trace: .*avail.log:1: cannot tell the trace "
                     r"format .*known formats: bamboo .*counts"):
    recipe_lib.build_recipe(quick(rollout="ray", num_workers=2, preempt_trace=str(bad)))
  empty = tmp_path / "zero.csv"
  empty.write_text("0,0\n60,0\n")
  with pytest.raises(ValueError, match="never makes an instance available"):
    RolloutSetup(rollout="ray", preempt_trace=str(empty))
  ok = tmp_path / "counts.csv"
  ok.write_text("date, time, available\n2021-12-11, 10:00, 2\n2021-12-11, 10:01, 1\n")
  assert RolloutSetup(rollout="ray", preempt_trace=str(ok)).preempt_trace == str(ok)
  huge = tmp_path / "huge.csv"  # a count of 1e9 instances built a billion events (a hang)
  huge.write_text("0,1\n60,1e9\n")
  with pytest.raises(ValueError, match=r"--preempt_trace: .*huge.csv:2: 1,000,000,000 instances"):
    RolloutSetup(rollout="ray", preempt_trace=str(huge))
  with pytest.raises(ValueError, match="--trace_time_scale must be a finite number > 0"):
    RolloutSetup(rollout="ray", preempt_trace=str(ok), trace_time_scale=float("nan"))

"""The run's rollout: splitting the embedded engines changes no sample, and a bad spot trace
fails the build before Ray starts."""
import numpy as np
import pytest

from jaxrl_sys.train import recipe as recipe_lib
from tests.train.common import quick


def test_two_local_engines_train_on_the_samples_one_engine_draws():
  """Tokens are a function of the request key and index: two engines draw the very samples one
  engine draws, so the rewards are equal and the losses equal up to float reassociation."""
  runs = [recipe_lib.run_recipe(recipe_lib.build_recipe(quick(steps=2, local_workers=n)))
          for n in (1, 2)]
  (a, b) = [[(h["reward_mean"], h["response_len_mean"], h["loss"], h["kl"]) for h in r.run.history]
            for r in runs]
  np.testing.assert_array_equal(np.array(a)[:, :2], np.array(b)[:, :2])
  np.testing.assert_allclose(np.array(a)[:, 2:], np.array(b)[:, 2:], rtol=1e-4, atol=1e-6)


def test_a_bad_preempt_trace_fails_before_ray_starts(tmp_path, monkeypatch):
  from jaxrl_sys.rollout.workers import ray as ray_worker  # pylint: disable=import-outside-toplevel

  def no_ray(*a, **k):
    raise AssertionError("Ray was started before the trace was checked")

  monkeypatch.setattr(ray_worker, "init_ray", no_ray)
  bad = tmp_path / "avail.log"
  bad.write_text("instance i-1 up at noon\n")
  with pytest.raises(ValueError, match=r"rollout.preempt_trace: .*avail.log:1: cannot tell the "
                     r"trace format .*known formats: bamboo .*counts"):
    recipe_lib.build_recipe(quick(rollout="ray", num_workers=2, preempt_trace=str(bad)))

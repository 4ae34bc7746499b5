"""GRPO over Ray workers killed and restarted at random equals the undisturbed run; APRIL
over-provisioning and async staleness work unchanged with remote workers."""
import numpy as np
import pytest

from jaxrl_sys.train import recipe as recipe_lib
from tests.train.common import quick



def test_chaos_run_equals_the_undisturbed_run(ray_session):  # pylint: disable=unused-argument
  """12 steps; from the moment a first worker serves, a Ray worker is SIGKILLed every
  0.5-1.5 s of serving time (kills pause until a restarted worker has started) and its slot
  restarts half a second later. Workers stream a token every 30 ms, so generation fills most
  of the run and kills land mid-generation (5-6 kills, 30-60 requests migrated in three runs;
  at 10 ms and every 1-3 s a run sometimes saw one kill, or none mid-generation). Same seeds,
  so the same requests and keys: every group must be trained exactly once, in the same steps,
  and the loss curve must equal the in-process run's."""
  steps = 12
  ref = recipe_lib.run_recipe(recipe_lib.build_recipe(quick(steps=steps))).run.history
  rc = quick(steps=steps, rollout="ray", num_workers=3, chaos_kill_every=1.0,
             chaos_restart_after=0.5, worker_token_delay=0.03)
  got = recipe_lib.run_recipe(recipe_lib.build_recipe(rc)).run.history
  assert [h["group_ids"] for h in got] == [h["group_ids"] for h in ref]
  keys = ("loss", "kl", "grad_norm", "reward_mean", "response_len_mean")
  a = np.array([[h[k] for k in keys] for h in ref])
  b = np.array([[h[k] for k in keys] for h in got])
  np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  lost = sum(h.get("rollout_lost", 0) for h in got)
  migrated = sum(h.get("rollout_migrated", 0) for h in got)
  print(f"chaos: {lost} workers lost, {migrated} requests migrated, "
        f"{sum(h.get('rollout_tokens_kept', 0) for h in got)} tokens kept")
  assert lost >= 2, "the chaos schedule should have killed workers during the run"
  assert migrated >= 1, "some kills should have hit workers mid-generation"


@pytest.mark.parametrize("mode", ["sync_april", "async"])
def test_april_and_async_admission_through_ray_workers(ray_session, mode):  # pylint: disable=unused-argument
  """Sync with APRIL over-provisioning (in-flight extras aborted at the boundary, resumed first
  next step) and async with max_staleness=1, over Ray workers that get killed: every step trains
  exactly B groups, no group twice, and no token is more than one version old."""
  kw = dict(mode="sync", oversample=2.0) if mode == "sync_april" else dict(
      mode="async", max_staleness=1)
  rc = quick(steps=3, rollout="ray", num_workers=2, chaos_kill_every=5.0,
             chaos_restart_after=0.5, worker_token_delay=0.01, **kw)
  hist = recipe_lib.run_recipe(recipe_lib.build_recipe(rc)).run.history
  assert len(hist) == 3
  ids = [g for h in hist for g in h["group_ids"]]
  assert all(len(h["group_ids"]) == rc.prompts_per_step for h in hist)
  assert len(set(ids)) == len(ids), "a group was trained twice"
  # APRIL resumes an aborted partial on the next version (its first tokens are one version
  # old); async admits at most max_staleness = 1 versions behind.
  assert max(h["token_staleness_max"] for h in hist) <= 1

"""Adaptive rollout offload in the real RL loop.

- With no remote worker the offload path (hooks attached as the recipe attaches them) is plain
  co-located rollout: the run equals the run without it, bit for bit; that run's loop sees a
  session with the `RolloutSession` methods only.
- With 2 Ray workers slowed by a per-token delay, T_seed converges to where the trainer's wait
  and the remote wait balance; with fast (undelayed) workers, T_seed shrinks below its first
  window and below the slow workers' fixed point (more of each step goes to the remote
  workers). Tolerance: over the last 6 steps the mean of (trainer wait - remote wait) is within
  20% of the mean step time (the controller's fixed point is a zero mean gap; single steps
  oscillate around it by a few engine steps).
"""
import dataclasses

import jax
import numpy as np

from jaxrl_sys.rollout import InProcessWorker, ManagerConfig, RolloutManager
from jaxrl_sys.rollout.clock import WALL
from jaxrl_sys.rollout.types import RolloutClient, RolloutSession
from jaxrl_sys.rollout.elastic.offload import OffloadConfig
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.recipe.offload import KEY, OffloadHooks
from tests.conftest import RAY_COMPILE_CACHE
from tests.train.common import quick


class ProtocolOnly:
  """A session exposing the `RolloutSession` methods of `inner` and nothing else."""

  def __init__(self, inner):
    for name in {**vars(RolloutClient), **vars(RolloutSession)}:
      if not name.startswith("_"):
        setattr(self, name, getattr(inner, name))


def _run(steps, client=None, offload=None):
  """A loop over `client` (default: the recipe's session) with the offload controller attached
  as the recipe attaches it (a step hook, a tick hook, its checkpointed state)."""
  recipe = recipe_lib.build_recipe(quick(steps=steps))
  session = client or recipe_lib.rollout_session(recipe)
  hooks, parts = [], {}
  if offload is not None:
    controller = OffloadHooks(offload, session, WALL)
    controller.attach()
    hooks, parts = [controller], {KEY: controller}
  loop = recipe_lib.make_loop(recipe, recipe_lib.recipe_mesh(recipe.mesh_spec), session,
                              step_hooks=hooks, resumables=parts)
  try:
    return loop.run()
  finally:
    if client is None:
      session.close()


def test_offload_without_remote_workers_is_colocated_rollout():
  """Also: the loop uses nothing of its session beyond the protocol (no probing)."""
  recipe = recipe_lib.build_recipe(quick(steps=3))
  session = recipe_lib.rollout_session(recipe)
  try:
    a = _run(3, client=ProtocolOnly(session))
  finally:
    session.close()
  b = _run(3, offload=OffloadConfig(t_init=0.5))
  assert [h["reward_mean"] for h in a.history] == [h["reward_mean"] for h in b.history]
  for x, y in zip(jax.tree.leaves(a.state.params), jax.tree.leaves(b.state.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert all(h["seeded"] == 0.0 and h["tokens_remote"] == 0 for h in b.history)


def _offload_run(steps, local_delay, remote_delay, t_init):
  from jaxrl_sys.rollout.weights.ray import RayWeightStore  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.workers.ray import RayWorker  # pylint: disable=import-outside-toplevel
  recipe = recipe_lib.build_recipe(quick(steps=steps))
  mc = recipe.plan.rollout_model
  # one token per exchange, so the trainer's engine can hand off mid-response
  ec = dataclasses.replace(recipe.plan.engine, stream_every=1)
  remotes = [RayWorker(f"spot-{i}", mc, ec, token_delay=remote_delay, warmup=True,
                       compile_cache=RAY_COMPILE_CACHE) for i in range(2)]
  m = RolloutManager([InProcessWorker("trainer", mc, ec, local=True, token_delay=local_delay),
                      *remotes], store=RayWeightStore(), config=ManagerConfig(theta=2))
  try:
    return _run(steps, client=m, offload=OffloadConfig(t_init=t_init, rate=0.5)).history
  finally:
    m.close()


def test_t_seed_balances_the_waits_with_slow_workers_and_shrinks_with_fast_ones(ray_session):  # pylint: disable=unused-argument
  slow = _offload_run(12, local_delay=0.01, remote_delay=0.02, t_init=0.3)
  last = slow[-6:]
  gap = np.mean([h["t_wait_train"] - h["t_wait_remote"] for h in last])
  step = np.mean([h["time_step"] for h in last])
  seeds = [h["t_seed"] for h in last]
  print(f"slow workers: T_seed {np.round(seeds, 3)}, mean gap {gap:.3f} s, step {step:.3f} s")
  assert abs(gap) < 0.2 * step
  # both share the work (a step may go to one side when a worker restarts under load)
  assert sum(h["tokens_local"] > 0 and h["tokens_remote"] > 0 for h in last) >= len(last) // 2
  fast = _offload_run(10, local_delay=0.01, remote_delay=0.0, t_init=0.6)
  seeds_fast = [h["t_seed_next"] for h in fast]
  print(f"fast workers: T_seed {np.round(seeds_fast, 3)}")
  # T_seed moves toward the side that waits: up from 0.3 s with slow remote workers, down
  # from 0.6 s with fast ones (their levels depend on the host's load, the directions do not)
  assert np.mean(seeds) > 0.3 and np.mean(seeds_fast[-4:]) < 0.6
  assert np.mean([h["time_step"] for h in fast[-4:]]) < step  # faster steps

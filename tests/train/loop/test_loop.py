"""The host RL loop: learning, mesh invariance, off-policy modes."""
import time

import jax
import numpy as np
import pytest

from jaxrl_sys.models import init_params
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.loop.evaluate import evaluate
from jaxrl_sys.train.loop.rl_loop import RLLoop
from jaxrl_sys.train.loop.supervised import supervised_warmup
from tests.train.common import quick


def test_grpo_raises_reward_on_arithmetic():
  """Warm-up leaves the reward low; GRPO raises it far beyond sampling noise.

  The comparison is on a fixed evaluation set (same prompts and sampling keys before and
  after), so only the policy changes. Noise: 400 Bernoulli draws, std of the mean <= 0.025,
  so the required gain of 0.15 is ~4.5 standard deviations of the difference. Each CPU run is
  deterministic; gains seen while tuning (seeds 0-2, code revisions): +0.22 to +0.42.
  """
  t0 = time.monotonic()
  rc = quick(steps=100, prompts_per_step=64, sft_steps=60, lr_warmup_steps=5,
             learning_rate=1e-3)
  recipe = recipe_lib.build_recipe(rc)
  rc = recipe.config  # the task's lengths filled in
  mc, tok, task = recipe.model.config, recipe.model.tokenizer, recipe.task
  warm = {}

  def init():
    params = jax.jit(init_params, static_argnums=0)(mc, jax.random.PRNGKey(0))
    warm["params"] = supervised_warmup(params, mc, task, tok, steps=60, batch_size=32,
                                       learning_rate=3e-3,
                                       seq_len=rc.max_prompt_len + rc.max_new_tokens)
    return warm["params"]

  loop = RLLoop(mc, recipe.train, recipe.loop, task, tok, recipe_lib.recipe_mesh(recipe.mesh_spec),
                init_params=init)
  result = loop.run()
  kw = dict(samples=4, seed=123, loop_config=recipe.loop)
  before = evaluate(warm["params"], mc, task, tok, range(10_000, 10_100), **kw)
  after = evaluate(result.state.params, mc, task, tok, range(10_000, 10_100), **kw)
  rewards = [h["reward_mean"] for h in result.history]
  print(f"eval reward {before:.3f} -> {after:.3f}; train reward first10 "
        f"{np.mean(rewards[:10]):.3f} last10 {np.mean(rewards[-10:]):.3f}; "
        f"{time.monotonic() - t0:.0f}s")
  assert before < 0.35
  assert after > before + 0.15
  assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 0.15


def _losses(mesh):
  rc = quick(mesh=mesh, steps=3)
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc))
  return [(h["loss"], h["kl"], h["grad_norm"], h["reward_mean"]) for h in result.history]


def test_mesh_2x4_matches_1x1():
  """FSDP x tensor parallel on 8 fake devices gives the 1x1 loss curve (fp tolerance)."""
  a, b = np.array(_losses("1x1")), np.array(_losses("2x4"))
  np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("mode,eta", [("one_off", 0), ("async", 1)])
def test_off_policy_modes(mode, eta):
  rc = quick(mode=mode, max_staleness=eta, steps=4)
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc))
  hist = result.history
  assert [h["staleness_mean"] for h in hist][0] == 0.0
  if mode == "one_off":
    # step k >= 1 trains on samples generated entirely by version k - 1
    for h in hist[1:]:
      assert h["off_policy_token_frac"] == 1.0 and h["staleness_mean"] == 1.0
  else:
    assert max(h["staleness_mean"] for h in hist) <= eta + 1e-6
    assert any(h["off_policy_token_frac"] > 0 for h in hist)
  for h in hist:
    assert np.isfinite(h["loss"]) and h["behav_weight_mean"] > 0

"""The host RL loop: mesh invariance, off-policy modes. That GRPO learns is asserted once, end
to end, on the command a user runs: `tests/harness/test_cli_harness.py`."""

import numpy as np
import pytest

from jaxrl_sys.train import recipe as recipe_lib
from tests.precision_helpers import needs_devices
from tests.train.common import quick


def _losses(mesh):
  rc = quick(mesh=mesh, steps=3)
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc))
  return [(h["loss"], h["kl"], h["grad_norm"], h["reward_mean"]) for h in result.run.history]


@needs_devices(8)
def test_mesh_2x4_matches_1x1():
  """FSDP x tensor parallel on 8 fake devices gives the 1x1 loss curve (fp tolerance)."""
  a, b = np.array(_losses("1x1")), np.array(_losses("2x4"))
  np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("mode,eta", [("one_off", 0), ("async", 1)])
def test_off_policy_modes(mode, eta):
  rc = quick(mode=mode, max_staleness=eta, steps=4)
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc))
  hist = result.run.history
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

"""`train.step.programs`: equal configurations share one set of jitted programs per process;
any change that reaches the programs gets its own."""
import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxrl_sys.sharding import DEFAULT_RULES
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.step.programs import train_programs
from tests.train.common import quick


def test_equal_configs_share_programs_and_changed_ones_do_not():
  recipe = recipe_lib.build_recipe(quick(steps=3))
  mc, tc = recipe.model.config, recipe.train
  mesh = recipe_lib.recipe_mesh(recipe.mesh_spec)
  first = train_programs(mc, tc, "float32", mesh)
  # Equal values built anew (as a second loop or a re-run notebook cell builds them).
  again = train_programs(dataclasses.replace(mc), dataclasses.replace(tc), "float32",
                         recipe_lib.recipe_mesh(recipe.mesh_spec), tuple(DEFAULT_RULES))
  assert again.fns.step is first.fns.step and again.optimizer is first.optimizer
  changed = {
      "learning rate": (mc, dataclasses.replace(
          tc, optim=dataclasses.replace(tc.optim, learning_rate=tc.optim.learning_rate * 2)),
          "float32"),
      "moment dtype": (mc, tc, "bfloat16"),
      "model": (dataclasses.replace(mc, num_layers=mc.num_layers + 1), tc, "float32"),
  }
  for name, args in changed.items():
    assert train_programs(*args, mesh).fns.step is not first.fns.step, name
  # Rules that cannot be hashed: built anew, not cached.
  listed = train_programs(mc, tc, "float32", mesh, list(DEFAULT_RULES))
  assert listed.fns.step is not first.fns.step
  # The changed learning rate reaches the schedule built for it: twice the first at every step.
  lr2 = train_programs(*changed["learning rate"], mesh)
  steps = jnp.arange(0, 40, 3)
  np.testing.assert_allclose(np.asarray(lr2.schedule(steps)), 2 * np.asarray(first.schedule(steps)),
                             rtol=1e-6)

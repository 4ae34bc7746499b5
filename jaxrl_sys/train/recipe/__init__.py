"""The composition root: run settings -> built pieces -> a run in its own directory.

`build` (`build_recipe`: the run's plan and pieces; `rollout_session`, `eval_session`,
`make_loop`: each built in one place), `run` (`run_recipe`, what `python -m experiments.grpo`
runs), `offload` (the offload controller as hooks), `run_config` (the config tree), `cli` and
`config_file` (its flags and files), `run_dir` (run directories), `presets` (models and their
tokenizers).
"""
from jaxrl_sys.train.recipe.build import (Recipe, RecipeConfig, build_recipe, eval_session,
                                          make_loop, rollout_session)
from jaxrl_sys.train.recipe.run import RecipeResult, recipe_mesh, run_name, run_recipe

__all__ = ["Recipe", "RecipeConfig", "RecipeResult", "build_recipe", "eval_session", "make_loop",
           "recipe_mesh", "rollout_session", "run_name", "run_recipe"]

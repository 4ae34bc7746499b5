"""The composition root: run settings -> built pieces -> a run in its own directory.

`build.build_recipe` / `build.run_recipe` (what `python -m experiments.grpo` runs),
`run_dir` (run directories), `config_file` (`--config=FILE`), `presets` (models and their
tokenizers).
"""
from jaxrl_sys.train.recipe.build import (Recipe, RecipeConfig, RecipeResult, build_recipe,
                                          recipe_mesh, run_name, run_recipe)

__all__ = ["Recipe", "RecipeConfig", "RecipeResult", "build_recipe", "recipe_mesh", "run_name",
           "run_recipe"]

"""The composition root: run settings -> built pieces -> a run in its own directory.

`build.build_recipe` / `build.run_recipe` (what `python -m experiments.grpo` runs),
`run_dir` (run directories), `config_file` (`--config=FILE`), `presets` (models and their
tokenizers), `rollout_setup` (where rollout runs).
"""
_EXPORTS = ("Recipe", "RecipeConfig", "RecipeResult", "build_recipe", "recipe_mesh", "run_name",
            "run_recipe")


def __getattr__(name):
  if name in _EXPORTS:
    from jaxrl_sys.train.recipe import build  # pylint: disable=import-outside-toplevel
    return getattr(build, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_EXPORTS)

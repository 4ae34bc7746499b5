"""Shared settings for the trainer tests.

Every test run uses the same shapes where it can (micro-batches of 16 groups x 4 samples =
64 rows of 12 tokens, the tiny preset, GRPO with KL), so the compiled programs are shared
through the persistent compilation cache (2 CPU cores: compiling dominates the test time).
"""
import dataclasses

from jaxrl_sys.train.recipe.build import RecipeConfig

QUICK = RecipeConfig(steps=3, prompts_per_step=4, group_size=4, micro_batch_groups=16,
                     sft_steps=0, save_every=1, progress=False, lr_warmup_steps=0)


def quick(**kw) -> RecipeConfig:
  return dataclasses.replace(QUICK, **kw)

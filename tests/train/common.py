"""Shared settings for the trainer tests.

Every test run uses the same shapes where it can (micro-batches of 16 groups x 4 samples =
64 rows of 12 tokens, the tiny preset, GRPO with KL), so the compiled programs are shared
through the persistent compilation cache (2 CPU cores: compiling dominates the test time).
"""
import dataclasses

from jaxrl_sys.train.recipe.build import RecipeConfig

# float32 compute on every backend ("auto" is bfloat16 on a GPU): the tests' references are
# float32, and the numbers they compare must not depend on where the suite runs.
QUICK = RecipeConfig(steps=3, prompts_per_step=4, group_size=4, micro_batch_groups=16,
                     sft_steps=0, save_every=1, progress=False, lr_warmup_steps=0,
                     compute_dtype="float32")


def quick(**kw) -> RecipeConfig:
  return dataclasses.replace(QUICK, **kw)


def bf16_hf_dir(path) -> str:
  """The tiny Qwen3 of `examples.make_tiny_hf_model` (char tokenizer of the arithmetic task),
  re-saved in bfloat16 with `transformers`, as a user's real checkpoint would be."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  from examples.make_tiny_hf_model import main  # pylint: disable=import-outside-toplevel
  main(str(path))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(path)).to(torch.bfloat16)
  model.save_pretrained(str(path), safe_serialization=True)
  return str(path)

"""GRPO-family RL post-training: `python -m experiments.grpo [--mesh=8x4] [--algo=grpo] ...`.

Defaults run the embedded setup: a tiny model, a short supervised warm-up on 1-digit addition,
then GRPO with the in-process rollout engine; reward rises visibly within a minute or two on a
laptop CPU. Outputs in --out_dir: metrics.jsonl, TensorBoard events (tb/), reward_kl.png,
final_params.npz, config.json. SIGTERM: finish the step, checkpoint, exit 0; `--resume`
continues from the newest usable checkpoint in --checkpoint_dir.

--mesh=AxB on a machine without that many accelerators fakes A*B CPU devices: the flag is read
from argv before JAX initialises (XLA_FLAGS=--xla_force_host_platform_device_count).
"""
from __future__ import annotations

import os
import sys


def _early_mesh_size(argv: list[str]) -> int | None:
  """The device count of --mesh in argv (None if absent or malformed; validated later)."""
  for i, a in enumerate(argv):
    value = None
    if a.startswith("--mesh="):
      value = a.split("=", 1)[1]
    elif a == "--mesh" and i + 1 < len(argv):
      value = argv[i + 1]
    if value is not None:
      # Importing jax does not start its backend, so XLA_FLAGS can still be set afterwards.
      from jaxrl_sys.sharding.mesh import parse_mesh  # pylint: disable=import-outside-toplevel
      try:
        return parse_mesh(value).size
      except ValueError:
        return None
  return None


def _fake_cpu_devices(argv: list[str]) -> None:
  """Sets the CPU device count for --mesh unless XLA_FLAGS already sets one (before jax)."""
  size = _early_mesh_size(argv)
  flags = os.environ.get("XLA_FLAGS", "")
  if size and size > 1 and "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={size}".strip()


if __name__ == "__main__":
  _fake_cpu_devices(sys.argv)

# pylint: disable=wrong-import-position
from absl import app, flags, logging as absl_logging  # noqa: E402

from jaxrl_sys.train.config import ALGOS, MODES  # noqa: E402



def _defaults():
  from jaxrl_sys.train.recipe import RecipeConfig  # pylint: disable=import-outside-toplevel
  return RecipeConfig()


_RC = _defaults()
FLAGS = flags.FLAGS
flags.DEFINE_string("mesh", _RC.mesh, "Device mesh data x model, e.g. 8x4 (faked on CPU).")
flags.DEFINE_string("algo", _RC.algo, f"Algorithm: one of {'|'.join(ALGOS)}.")
flags.DEFINE_string("model", _RC.model, "Model preset (tiny, tiny_moe) or a local HF directory.")
flags.DEFINE_string("task", _RC.task, "Task: arithmetic or countdown.")
flags.DEFINE_string("task_args", _RC.task_args, "Task arguments, e.g. num_digits=2,ops=+-.")
flags.DEFINE_integer("group_size", _RC.group_size, "Samples per prompt G (MC-GRPO draws G+1).")
flags.DEFINE_integer("prompts_per_step", _RC.prompts_per_step, "Prompts (groups) per step B.")
flags.DEFINE_integer("steps", _RC.steps, "Train steps.")
flags.DEFINE_string("mode", _RC.mode, f"Rollout mode: {'|'.join(MODES)}.")
flags.DEFINE_integer("max_staleness", _RC.max_staleness, "Async mode: max staleness eta.")
flags.DEFINE_integer("micro_batch_groups", _RC.micro_batch_groups, "Groups per micro-batch m_b.")
flags.DEFINE_bool("dynamic_micro_batching", _RC.dynamic_micro_batching,
                  "Start a micro-batch as soon as m_b groups are complete.")
flags.DEFINE_integer("max_new_tokens", _RC.max_new_tokens, "Response budget.")
flags.DEFINE_integer("max_prompt_len", _RC.max_prompt_len, "Prompt length bucket (tokens).")
flags.DEFINE_float("temperature", _RC.temperature, "Sampling temperature.")
flags.DEFINE_float("oversample", _RC.oversample,
                   "APRIL over-provisioning (sync/one_off): submit B*x groups, keep the first B "
                   "complete, resume the rest next step.")
flags.DEFINE_float("learning_rate", _RC.learning_rate, "RL learning rate (AdamW).")
flags.DEFINE_integer("lr_warmup_steps", _RC.lr_warmup_steps, "Linear learning-rate warm-up.")
flags.DEFINE_float("kl_coef", None, "KL coefficient (default: the algorithm's preset).")
flags.DEFINE_integer("sft_steps", _RC.sft_steps, "Supervised warm-up steps (fresh runs).")
flags.DEFINE_float("sft_learning_rate", _RC.sft_learning_rate, "Warm-up learning rate.")
flags.DEFINE_integer("sft_batch_size", _RC.sft_batch_size, "Warm-up batch size.")
flags.DEFINE_string("checkpoint_dir", None, "Checkpoint directory (none: no checkpoints).")
flags.DEFINE_integer("save_every", _RC.save_every, "Checkpoint every N steps.")
flags.DEFINE_integer("keep_checkpoints", _RC.keep_checkpoints, "Keep the last K checkpoints.")
flags.DEFINE_bool("resume", False, "Resume from the newest usable checkpoint.")
flags.DEFINE_integer("seed", _RC.seed, "Seed.")
flags.DEFINE_string("out_dir", "runs/grpo", "Metrics / plot / final params directory.")
flags.DEFINE_bool("progress", True, "Show the progress line on stderr.")
flags.DEFINE_string("compile_cache", ".jax_cache", "Persistent compilation cache ('' = off).")


def recipe_from_flags():
  """A `RecipeConfig` from the parsed flags."""
  from jaxrl_sys.train.recipe import RecipeConfig  # pylint: disable=import-outside-toplevel
  return RecipeConfig(
      mesh=FLAGS.mesh, algo=FLAGS.algo, model=FLAGS.model, task=FLAGS.task,
      task_args=FLAGS.task_args, group_size=FLAGS.group_size,
      prompts_per_step=FLAGS.prompts_per_step, steps=FLAGS.steps, mode=FLAGS.mode,
      max_staleness=FLAGS.max_staleness, micro_batch_groups=FLAGS.micro_batch_groups,
      dynamic_micro_batching=FLAGS.dynamic_micro_batching, max_new_tokens=FLAGS.max_new_tokens,
      max_prompt_len=FLAGS.max_prompt_len, temperature=FLAGS.temperature,
      oversample=FLAGS.oversample,
      learning_rate=FLAGS.learning_rate, lr_warmup_steps=FLAGS.lr_warmup_steps,
      kl_coef=FLAGS.kl_coef, sft_steps=FLAGS.sft_steps,
      sft_learning_rate=FLAGS.sft_learning_rate, sft_batch_size=FLAGS.sft_batch_size,
      checkpoint_dir=FLAGS.checkpoint_dir, save_every=FLAGS.save_every,
      keep_checkpoints=FLAGS.keep_checkpoints, seed=FLAGS.seed, out_dir=FLAGS.out_dir or None,
      progress=FLAGS.progress)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  if FLAGS.compile_cache:
    jax.config.update("jax_compilation_cache_dir", os.path.abspath(FLAGS.compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    recipe = recipe_lib.build_recipe(recipe_from_flags())
    result = recipe_lib.run_recipe(recipe, resume=FLAGS.resume)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if result.resumed_from is not None:
    print(f"resumed from step {result.resumed_from}", file=sys.stderr)
  last = result.history[-1] if result.history else {}
  status = "preempted (checkpoint saved)" if result.preempted else "done"
  print(f"{status}: step {int(jax.device_get(result.state.step))}/{FLAGS.steps}, "
        f"reward {last.get('reward_mean', float('nan')):.3f}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  app.run(main)

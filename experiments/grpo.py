"""GRPO-family RL post-training: `python -m experiments.grpo [--mesh=8x4] [--algo=grpo] ...`.

Defaults run the embedded setup: a tiny model, a short supervised warm-up on 1-digit addition,
then GRPO with the in-process rollout engine; reward rises visibly within a minute or two on a
laptop CPU. Bring your own prompts and reward with `--task=jsonl:PATH --reward=module:function`
and your own model with `--model=/path/to/hf-dir`; `--export_hf=DIR` writes the trained policy
as a Hugging Face directory. `--config=FILE` (YAML / JSON, the flag names as keys) sets flags;
the command line wins.

Each run writes into its own directory (--out_dir, default a new runs/<algo>-<task>-<time>):
config.json (feed it back with --config to repeat the run), metrics.jsonl, TensorBoard events
(tb/), reward_kl.png, checkpoints/ (unless --checkpoint_dir), final_params.npz. An --out_dir
that already holds a run is refused unless --resume (continue it) or --overwrite (replace it).
SIGTERM: finish the step, checkpoint, exit 0; `--resume` continues from the newest usable
checkpoint, and refuses (exit 2) a checkpoint written by a different configuration. A
non-finite loss or gradient stops the run with exit 3 (or is skipped with --skip_nonfinite).

--mesh=AxB on a machine without that many accelerators fakes A*B CPU devices: the flag is read
from argv (or the --config file) before JAX initialises
(XLA_FLAGS=--xla_force_host_platform_device_count).
"""
from __future__ import annotations

import dataclasses
import os
import sys


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of --name=V / --name V in argv (None if absent)."""
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _early_mesh_size(argv: list[str]) -> int | None:
  """The device count of --mesh in argv, else of `mesh` in the --config file (None if absent
  or malformed; validated later)."""
  value = _flag_value(argv, "mesh")
  if value is None and _flag_value(argv, "config"):
    from jaxrl_sys.train.config_file import read_config_file  # pylint: disable=import-outside-toplevel
    try:
      value = read_config_file(_flag_value(argv, "config")).get("mesh")
    except ValueError:
      return None
  if value is None:
    return None
  # Importing jax does not start its backend, so XLA_FLAGS can still be set afterwards.
  from jaxrl_sys.sharding.mesh import parse_mesh  # pylint: disable=import-outside-toplevel
  try:
    return parse_mesh(str(value)).size
  except ValueError:
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
flags.DEFINE_string("model", _RC.model, "Model preset (tiny, tiny_moe) or a local HF directory "
                    "(config.json, *.safetensors, tokenizer.json).")
flags.DEFINE_string("task", _RC.task, "Task: arithmetic, countdown, or a prompt data set "
                    "jsonl:PATH (also parquet:PATH, datasets:DIR).")
flags.DEFINE_string("task_args", _RC.task_args, "Task arguments, e.g. num_digits=2,ops=+- "
                    "(default: the task's own; data sets: prompt_key=..., answer_key=...).")
flags.DEFINE_string("reward", _RC.reward, "Reward of a data-set task: module:function or "
                    "path/to/file.py:function, called as fn(prompt, completion, **row) -> float "
                    "(default: exact match on the rows' answer field).")
flags.DEFINE_integer("group_size", _RC.group_size, "Samples per prompt G (MC-GRPO draws G+1).")
flags.DEFINE_integer("prompts_per_step", _RC.prompts_per_step, "Prompts (groups) per step B.")
flags.DEFINE_integer("steps", _RC.steps, "Train steps.")
flags.DEFINE_string("mode", _RC.mode, f"Rollout mode: {'|'.join(MODES)}.")
flags.DEFINE_integer("max_staleness", _RC.max_staleness, "Async mode: max staleness eta.")
flags.DEFINE_integer("micro_batch_groups", _RC.micro_batch_groups, "Groups per micro-batch m_b.")
flags.DEFINE_bool("dynamic_micro_batching", _RC.dynamic_micro_batching,
                  "Start a micro-batch as soon as m_b groups are complete.")
flags.DEFINE_integer("max_new_tokens", _RC.max_new_tokens,
                     "Response budget (default: the task's; data sets: from the answers).")
flags.DEFINE_integer("max_prompt_len", _RC.max_prompt_len,
                     "Prompt length bucket in tokens (default: the task's; data sets: the "
                     "longest prompt).")
flags.DEFINE_float("temperature", _RC.temperature, "Sampling temperature.")
flags.DEFINE_float("oversample", _RC.oversample,
                   "APRIL over-provisioning (sync/one_off): submit B*x groups, keep the first B "
                   "complete, resume the rest next step.")
flags.DEFINE_float("learning_rate", _RC.learning_rate, "RL learning rate (AdamW).")
flags.DEFINE_integer("lr_warmup_steps", _RC.lr_warmup_steps, "Linear learning-rate warm-up.")
flags.DEFINE_float("kl_coef", None, "KL coefficient (default: the algorithm's preset).")
flags.DEFINE_bool("skip_nonfinite", _RC.skip_nonfinite,
                  "Drop an update whose gradient is not finite instead of stopping the run "
                  "(stops after 10 in a row).")
flags.DEFINE_integer("sft_steps", _RC.sft_steps, "Supervised warm-up steps on the task's "
                     "answers, fresh runs only (default: 60 for the tiny presets, 0 for a "
                     "Hugging Face model).")
flags.DEFINE_float("sft_learning_rate", _RC.sft_learning_rate, "Warm-up learning rate.")
flags.DEFINE_integer("sft_batch_size", _RC.sft_batch_size, "Warm-up batch size.")
flags.DEFINE_bool("chat_template", _RC.chat_template,
                  "Wrap prompts in the HF tokenizer's chat template when it has one.")
flags.DEFINE_integer("eval_every", _RC.eval_every,
                     "Evaluate on held-out prompts every N steps and at the end (0 = off).")
flags.DEFINE_integer("eval_prompts", _RC.eval_prompts, "Held-out prompts (data sets: the last "
                     "rows, removed from training when --eval_every > 0).")
flags.DEFINE_string("checkpoint_dir", None,
                    "Checkpoint directory (default: checkpoints/ in the run directory).")
flags.DEFINE_integer("save_every", _RC.save_every,
                     "Checkpoint every N steps (0 = only at the end and on SIGTERM).")
flags.DEFINE_integer("keep_checkpoints", _RC.keep_checkpoints, "Keep the last K checkpoints.")
flags.DEFINE_bool("resume", False, "Resume from the newest usable checkpoint of --out_dir (or "
                  "--checkpoint_dir).")
flags.DEFINE_integer("seed", _RC.seed, "Seed.")
flags.DEFINE_string("out_dir", None, "Run directory (default: a new runs/<algo>-<task>-<time>).")
flags.DEFINE_bool("overwrite", False, "Replace the outputs of an earlier run in --out_dir (and "
                  "a non-empty --export_hf directory).")
flags.DEFINE_string("export_hf", None, "Write the trained policy as a Hugging Face directory "
                    "(safetensors, config.json, tokenizer files).")
flags.DEFINE_string("config", None, "YAML or JSON file of flag values (keys = flag names); "
                    "flags on the command line win. A run's config.json repeats it.")
flags.DEFINE_bool("progress", True, "Show the progress bar on stderr.")
flags.DEFINE_string("compile_cache", ".jax_cache", "Persistent compilation cache ('' = off).")
flags.DEFINE_enum("rollout", _RC.rollout, ["local", "ray"],
                  "Where rollout runs: in-process on the trainer's devices, or Ray workers.")
flags.DEFINE_integer("num_workers", _RC.num_workers, "Ray rollout workers (--rollout=ray).")
flags.DEFINE_integer("local_workers", _RC.local_workers,
                     "In-process engines splitting the local rollout's slots, side by side on "
                     "threads (0 = auto: 2 on a CPU host when each keeps >= 32 slots, else 1).")
flags.DEFINE_string("ray_address", None, "Ray cluster address (default: start a local Ray).")
flags.DEFINE_string("weight_store", None,
                    "memory | ray | tensorstore:PATH_OR_URL (default: memory for local rollout, "
                    "ray for Ray workers).")
flags.DEFINE_string("preempt_trace", None,
                    "Spot trace (Bamboo CSV / Parcae JSONL) that starts and SIGKILLs Ray workers.")
flags.DEFINE_float("trace_time_scale", _RC.trace_time_scale,
                   "Host seconds per trace second (1/60: a trace minute per second).")
flags.DEFINE_float("chaos_kill_every", _RC.chaos_kill_every,
                   "Mean seconds between random SIGKILLs of a Ray worker (0 = off).")
flags.DEFINE_float("chaos_restart_after", _RC.chaos_restart_after,
                   "Seconds before a chaos-killed worker's slot restarts.")
flags.DEFINE_integer("max_request_failures", _RC.max_request_failures,
                     "Ray rollout: worker errors a request may survive before the run stops "
                     "(preempted or killed workers never count).")
flags.DEFINE_string("offload", _RC.offload,
                    "Rollout offload with Ray workers: off | adaptive (RLBoost seeding: the "
                    "trainer generates for T_seed, then hands off) | a fixed T_seed in seconds.")
flags.DEFINE_float("t_seed_init", _RC.t_seed_init, "First seeding window (adaptive offload).")
flags.DEFINE_float("worker_cpus", _RC.worker_cpus, "Ray resources: CPUs per rollout worker.")
flags.DEFINE_float("worker_gpus", _RC.worker_gpus, "Ray resources: GPUs per rollout worker.")
flags.DEFINE_float("worker_token_delay", _RC.worker_token_delay,
                   "Seconds each Ray worker sleeps per token (slow workers, for experiments).")


def apply_config_file(path: str) -> None:
  """Sets every flag named in the file that the command line did not set."""
  from jaxrl_sys.train import config_file  # pylint: disable=import-outside-toplevel
  data = config_file.read_config_file(path)
  known = [f.name for f in dataclasses.fields(_RC)]
  config_file.check_keys(data, known, path)
  for key, value in data.items():
    if FLAGS[key].present:
      continue
    try:
      if value is None:
        FLAGS[key].value = None
      else:
        FLAGS[key].parse(value)
    except (flags.IllegalFlagValueError, ValueError, TypeError) as e:
      raise ValueError(f"--config={path}: bad value {value!r} for {key!r}: {e}") from e


def recipe_from_flags():
  """A `RecipeConfig` from the parsed flags (and the --config file)."""
  from jaxrl_sys.train.recipe import RecipeConfig, run_name  # pylint: disable=import-outside-toplevel
  if FLAGS.config:
    apply_config_file(FLAGS.config)
  rc = RecipeConfig(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(RecipeConfig)})
  if FLAGS.resume and not (rc.out_dir or rc.checkpoint_dir):
    raise ValueError("--resume needs the run to continue: its --out_dir (or --checkpoint_dir)")
  if not rc.out_dir:
    from jaxrl_sys.train.run_dir import new_run_dir  # pylint: disable=import-outside-toplevel
    rc = dataclasses.replace(rc, out_dir=new_run_dir("runs", run_name(rc)))
  return rc


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.guard import DivergenceError  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from jaxrl_sys.rollout.manager import RequestFailedError, RolloutStalledError, WeightPullError
  if FLAGS.compile_cache:
    jax.config.update("jax_compilation_cache_dir", os.path.abspath(FLAGS.compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    rc = recipe_from_flags()
    print(f"loading model {rc.model!r} and task {rc.task!r}", file=sys.stderr)
    recipe = recipe_lib.build_recipe(rc)
    result = recipe_lib.run_recipe(recipe, resume=FLAGS.resume)
  except DivergenceError as e:
    print(f"error: {e}", file=sys.stderr)
    return 3
  except (ValueError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except (RequestFailedError, RolloutStalledError, WeightPullError) as e:
    print(f"error: rollout: {e}", file=sys.stderr)  # checkpoints already saved are kept
    return 1
  last = result.history[-1] if result.history else {}
  status = "preempted (checkpoint saved)" if result.preempted else "done"
  line = (f"{status}: step {int(jax.device_get(result.state.step))}/{recipe.config.steps}, "
          f"reward {last.get('reward_mean', float('nan')):.3f}")
  if "eval_reward" in last:
    line += f", eval reward {last['eval_reward']:.3f}"
  print(line, file=sys.stderr)
  for note in result.notes:
    print(f"note: {note}", file=sys.stderr)
  if result.outputs:
    print("outputs:\n  " + "\n  ".join(result.outputs), file=sys.stderr)
  return 0


if __name__ == "__main__":
  app.run(main)

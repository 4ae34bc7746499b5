"""GRPO-family RL post-training: `python -m experiments.grpo [--mesh=8x4] [--algo=grpo] ...`.

Defaults run the embedded setup: a tiny model, a short supervised warm-up on 1-digit addition,
then GRPO with the in-process rollout engine; reward rises visibly within a minute or two on a
laptop CPU. Bring your own prompts and reward with `--task=jsonl:PATH --reward=module:function`
and your own model with `--model=/path/to/hf-dir`; `--export_hf=DIR` writes the trained policy
as a Hugging Face directory. `--config=FILE` (YAML / JSON: the config tree, or flag names as
keys) sets flags; the command line wins.

Every run setting is a flag generated from the config tree (`jaxrl_sys.train.recipe.run_config`):
`--loop.steps=100`, `--optim.schedule=cosine`, ...; the short names (`--steps`, `--mesh`,
`--model`, `--task`, `--learning_rate`, ...) are aliases of the same flags. `--helpfull` lists
them with their documentation.

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
  """The device count of --mesh (or --distributed.mesh) in argv, else of the mesh in the
  --config file (None if absent or malformed; validated later)."""
  value = _flag_value(argv, "mesh") or _flag_value(argv, "distributed.mesh")
  if value is None and _flag_value(argv, "config"):
    from jaxrl_sys.train.recipe import config_file  # pylint: disable=import-outside-toplevel
    path = _flag_value(argv, "config")
    try:
      value = config_file.flat_settings(config_file.read_config_file(path), path).get(
          "distributed.mesh")
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

from jaxrl_sys.train.recipe import cli  # noqa: E402

FLAGS = flags.FLAGS
# Every run setting: --section.field (help = the field's docstring) and its short alias.
cli.define_flags(FLAGS, module_name=sys.argv[0] if __name__ == "__main__" else __name__)
# How this invocation runs, not what the run computes.
flags.DEFINE_string("config", None, "YAML or JSON file of settings: the config tree of a run's "
                    "config.json, or flag names (short or section.field) as keys; flags on the "
                    "command line win. A run's config.json repeats it.")
flags.DEFINE_bool("resume", False, "Resume from the newest usable checkpoint of --out_dir (or "
                  "--checkpoint_dir).")
flags.DEFINE_string("compile_cache", ".jax_cache", "Persistent compilation cache ('' = off).")


def recipe_from_flags():
  """The `RunConfig` of the parsed flags (and the --config file)."""
  from jaxrl_sys.train.recipe import run_name  # pylint: disable=import-outside-toplevel
  if FLAGS.config:
    cli.apply_config_file(FLAGS.config, FLAGS)
  rc = cli.run_config_from_flags(FLAGS)
  if FLAGS.resume and not (rc.output.out_dir or rc.checkpoint.directory):
    raise ValueError("--resume needs the run to continue: its --out_dir (or --checkpoint_dir)")
  if not rc.output.out_dir:
    from jaxrl_sys.train.recipe.run_dir import new_run_dir  # pylint: disable=import-outside-toplevel
    rc = rc.replace(out_dir=new_run_dir("runs", run_name(rc)))
  return rc


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.loop.guard import DivergenceError  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from jaxrl_sys.rollout.manager import RequestFailedError, RolloutStalledError, WeightPullError
  if FLAGS.compile_cache:
    jax.config.update("jax_compilation_cache_dir", os.path.abspath(FLAGS.compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    rc = recipe_from_flags()
    print(f"loading model {rc.model.name!r} and task {rc.task.name!r}", file=sys.stderr)
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
  line = (f"{status}: step {int(jax.device_get(result.state.step))}/{recipe.config.loop.steps}, "
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

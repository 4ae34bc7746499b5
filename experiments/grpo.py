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
SIGTERM: finish the step, checkpoint, exit 0; SIGINT (Ctrl-C): the same, exit 130; a second
Ctrl-C stops at once once the save in flight is written (exit 130). `--resume` continues from
the newest usable checkpoint, and refuses (exit 2) a checkpoint written by a different
configuration, --steps below the step reached, and a directory whose checkpoints are all
unreadable; each call's changed settings are listed and kept in config.json's history. A run
holds a lock on its directory (.lock: pid, host, start time): another run's --overwrite or
--resume of it is refused while it lives; a dead run's lock is reclaimed. A non-finite loss or
gradient stops the run with exit 3 (or is skipped with --skip_nonfinite). Bad input is
reported in one line, exit 2.

--mesh=AxB on a machine without that many accelerators fakes A*B CPU devices: the flag is read
from argv (or the --config file) before JAX initialises
(XLA_FLAGS=--xla_force_host_platform_device_count); with --num_processes=N each process fakes
A*B/N of them.

Several processes (one per host, each running the same command) form one JAX job with
--coordinator_address=HOST:PORT --num_processes=N --process_id=I, or with no flags under SLURM,
Open MPI, a TPU pod slice or Kubernetes (detected); the mesh spans all their devices. See
docs/multihost.md.
"""
from __future__ import annotations

import json
import os
import signal
import sys


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of --name=V / --name V in argv (None if absent)."""
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _early_value(argv: list[str], path: str, short: str):
  """The value of setting `path` (e.g. "distributed.mesh") from argv (--short or --path), else
  from the --config file (any of its spellings); None if absent or unreadable. Read before
  JAX starts, so from the raw argv rather than the parsed flags."""
  value = _flag_value(argv, short) or _flag_value(argv, path)
  if value is None and _flag_value(argv, "config"):
    from jaxrl_sys.train.recipe import config_file  # pylint: disable=import-outside-toplevel
    config = _flag_value(argv, "config")
    try:
      value = config_file.flat_settings(config_file.read_config_file(config), config).get(path)
    except ValueError:
      return None
  return value


def _early_mesh_size(argv: list[str]) -> int | None:
  """The device count of --mesh (or --distributed.mesh) in argv, else of the mesh in the
  --config file (None if absent or malformed; validated later)."""
  value = _early_value(argv, "distributed.mesh", "mesh")
  if value is None:
    return None
  # Importing jax does not start its backend, so XLA_FLAGS can still be set afterwards.
  from jaxrl_sys.sharding.mesh import parse_mesh  # pylint: disable=import-outside-toplevel
  try:
    return parse_mesh(str(value)).size
  except ValueError:
    return None


def _early_process_count(argv: list[str]) -> int:
  """--num_processes (argv or --config), else the detected cluster's process count, else 1."""
  value = _early_value(argv, "distributed.num_processes", "num_processes")
  try:
    if value is not None and int(value) >= 1:
      return int(value)
  except ValueError:
    return 1
  from jaxrl_sys.train.multihost.job import detect_cluster  # pylint: disable=import-outside-toplevel
  found = detect_cluster()
  return found[1] if found else 1


def _fake_cpu_devices(argv: list[str]) -> None:
  """Sets the CPU device count for --mesh unless XLA_FLAGS already sets one (before jax): the
  mesh's devices, or this process's share of them when several processes form the job."""
  size = _early_mesh_size(argv)
  if size:
    processes = _early_process_count(argv)
    size = size // processes if size % processes == 0 else size
  flags = os.environ.get("XLA_FLAGS", "")
  from jaxrl_sys.train.recipe import limits  # pylint: disable=import-outside-toplevel
  if size and size > limits.MAX_FAKE_CPU_DEVICES:
    return  # refused by build_recipe with a message, unless the accelerators have that many
  if size and size > 1 and "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={size}".strip()
    note = limits.fake_devices_note(size)
    if note:
      print(note, file=sys.stderr)


def _interrupted_while_starting(signum, frame):  # pylint: disable=unused-argument
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # leaving anyway: more Ctrl-C change nothing
  print("interrupted (SIGINT) while starting: nothing was run", file=sys.stderr)
  sys.exit(130)


if __name__ == "__main__":
  # Ctrl-C while the imports below run (seconds on a busy machine): exit 130, no traceback.
  signal.signal(signal.SIGINT, _interrupted_while_starting)
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
  if FLAGS.resume and rc.output.overwrite:
    from jaxrl_sys.train.recipe.run_dir import RESUME_OVERWRITE  # pylint: disable=import-outside-toplevel
    raise ValueError(RESUME_OVERWRITE)
  if FLAGS.resume and not (rc.output.out_dir or rc.checkpoint.directory):
    raise ValueError("--resume needs the run to continue: its --out_dir (or --checkpoint_dir)")
  if not rc.output.out_dir:
    from jaxrl_sys.train.multihost.collectives import share_from_main  # pylint: disable=import-outside-toplevel
    from jaxrl_sys.train.recipe.run_dir import new_run_dir  # pylint: disable=import-outside-toplevel
    # Several processes: process 0 names the directory, the others read it.
    rc = rc.replace(out_dir=share_from_main("run_dir", lambda: new_run_dir("runs", run_name(rc))))
  return rc


def join_job():
  """Joins the multi-process job the flags (or the environment) describe, before JAX starts
  (`train.multihost.job.initialize`) with the `distributed` section of the flags (and the
  --config file); returns its watchdog (None for one process)."""
  from jaxrl_sys.train.multihost import job  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.recipe import config_file  # pylint: disable=import-outside-toplevel
  if FLAGS.config:
    cli.apply_config_file(FLAGS.config, FLAGS)
  rc = cli.run_config_from_flags(FLAGS)
  # what every process must agree on: the run's settings (not where it writes or how this
  # process is placed) and whether it resumes
  settings = config_file.flatten(config_file.reproducible(rc))
  settings["resume"] = bool(FLAGS.resume)
  return job.initialize(rc.distributed, settings=json.loads(json.dumps(settings)))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt from here on
  import jax  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.loop.guard import DivergenceError  # pylint: disable=import-outside-toplevel
  if FLAGS.compile_cache:
    jax.config.update("jax_compilation_cache_dir", os.path.abspath(FLAGS.compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  absl_logging.set_verbosity(absl_logging.WARNING)
  from jaxrl_sys.train.multihost import job  # pylint: disable=import-outside-toplevel
  try:
    watchdog = join_job()
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except job.JoinError as e:  # a process missing at start-up: as a lost one
    print(f"error: {e}", file=sys.stderr)
    return job.EXIT_LOST_PROCESS
  try:
    code = _train(jax, recipe_lib, DivergenceError)
  except Exception as e:  # pylint: disable=broad-except
    if watchdog is None:
      raise
    # A failed collective most likely means a lost peer: name it once the watchdog knows (its
    # thread then ends the process). Any other error ends the peers too.
    runtime = "RuntimeError" in type(e).__name__
    lost = watchdog.lost(wait=watchdog.timeout if runtime else 0.0)
    watchdog.finish(error=lost or f"{type(e).__name__}: {str(e)[:200]}")
    if lost:
      print(f"error: {lost}", file=sys.stderr, flush=True)
      os._exit(4)  # pylint: disable=protected-access
    raise
  if watchdog is not None:
    watchdog.finish(error=None if code == 0 else f"exit status {code}")
  return code


def _train(jax, recipe_lib, DivergenceError):  # pylint: disable=invalid-name
  """Builds and runs the recipe; returns the exit status."""
  # pylint: disable-next=import-outside-toplevel
  from jaxrl_sys.rollout.manager import RequestFailedError, RolloutStalledError, WeightLoadError
  from jaxrl_sys.rollout.weights import WeightPublishError  # pylint: disable=import-outside-toplevel
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
  except KeyboardInterrupt as e:  # Ctrl-C outside the loop, or a second one inside it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # leaving anyway: more Ctrl-C change nothing
    what = str(e) or "SIGINT"
    print(f"interrupted ({what}); the checkpoint save in flight, if any, was written: continue "
          "with --resume", file=sys.stderr)
    return 130
  except (RequestFailedError, RolloutStalledError, WeightLoadError, WeightPublishError) as e:
    print(f"error: rollout: {e}", file=sys.stderr)  # checkpoints already saved are kept
    return 1
  run = result.run
  if run.stop_signal == "SIGINT":   # leaving anyway: more Ctrl-C change nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)
  step = int(jax.device_get(run.state.step))
  total = recipe.config.loop.steps
  last = run.history[-1] if run.history else {}
  if run.stop_signal == "SIGINT":
    print(f"interrupted (SIGINT) after step {step}/{total}: checkpoint saved; continue with "
          "--resume", file=sys.stderr)
  else:
    status = "preempted (checkpoint saved)" if run.preempted else "done"
    if jax.process_count() > 1:
      status = f"process {jax.process_index()}/{jax.process_count()}: {status}"
    line = f"{status}: step {step}/{total}"
    line += (f", reward {last['reward_mean']:.3f}" if "reward_mean" in last
             else " (nothing left to train)" if not run.history else "")
    if "eval_reward" in last:
      line += f", eval reward {last['eval_reward']:.3f}"
    print(line, file=sys.stderr)
  for note in result.notes:
    print(f"note: {note}", file=sys.stderr)
  if result.outputs:
    print("outputs:\n  " + "\n  ".join(result.outputs), file=sys.stderr)
  return 130 if run.stop_signal == "SIGINT" else 0


if __name__ == "__main__":
  app.run(main)

"""The end-to-end GRPO recipe behind `python -m experiments.grpo`: a `RunConfig` -> built
pieces (`build_recipe`) -> a run in its own directory (`run_recipe`).

Default: a tiny dense model on 1-digit addition, a short supervised warm-up that leaves the
reward mid-range, then GRPO; it learns visibly in about a minute on a 2-core CPU.
`build_recipe` validates everything (mesh, algorithm, group size, lengths, task, reward,
model files) before any work and fills the task- and model-dependent defaults (`None` fields);
it is the one place that turns run settings into the step's, the loop's and rollout's configs;
`run_recipe` runs it in its run directory (see `train.run_dir`).

Bring your own task and model from Python:

    rc = RecipeConfig(model="/path/to/hf-model", task="jsonl:prompts.jsonl",
                      reward="mymod:score", steps=50, out_dir="runs/mine")
    result = run_recipe(build_recipe(rc))

or pass any object with `problem(i)` / `reward(problem, completion)` as
`build_recipe(rc, task=my_task)`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Any

import jax

from jaxrl_sys import backend
from jaxrl_sys.models import init_params
from jaxrl_sys.sharding import MeshSpec, make_mesh, parse_mesh
from jaxrl_sys.tasks import CountingTask, DatasetTask, make_task, parse_task_spec
from jaxrl_sys.tasks.dataset import unknown_characters_note
from jaxrl_sys.train.loop.config import CheckpointConfig, LoopConfig
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.recipe import limits
from jaxrl_sys.train.recipe.config_file import (HISTORY_KEY, WriteOnce, reproducible,
                                                settings_history)
from jaxrl_sys.train.loop.groups import encode_prompt
from jaxrl_sys.train.loop.guard import DivergenceError
from jaxrl_sys.train.loop import multihost
from jaxrl_sys.train.loop.rl_loop import RLLoop, RunResult
from jaxrl_sys.train.loop.local_client import check_lengths, default_engine_config
from jaxrl_sys.train.loop.metrics_log import Progress, plot_history
from jaxrl_sys.train.loop.periodic_eval import SYNTHETIC_EVAL_START, PeriodicEval
from jaxrl_sys.train.recipe.presets import LoadedModel, load_model
from jaxrl_sys.train.recipe.rollout_setup import RolloutSetup, ray_client
from jaxrl_sys.train.recipe.run_config import RecipeConfig, RunConfig
from jaxrl_sys.train.recipe.run_dir import (RESUME_OVERWRITE, check_directory_path,
                                            check_export_dir, claim_checkpoint_dir,
                                            claim_run_dir, describe_outputs,
                                            mark_export_dir, save_params, write_json)
from jaxrl_sys.train.loop.supervised import supervised_warmup

log = logging.getLogger(__name__)

# Built-in tasks: (task_args, max_prompt_len, max_new_tokens) used when the config leaves them
# None. The tiny presets' warm-up steps when `sft_steps` is None (a user's model gets none).
TASK_DEFAULTS = {"arithmetic": ("num_digits=1,ops=+", 8, 4), "countdown": ("", 16, 8)}
PRESET_SFT_STEPS = 60
# Identity of a run for `--resume` (CheckpointConfig.identity): what is trained, and on what
# (short setting names, as checkpoints written before the config tree recorded them).
IDENTITY_KEYS = ("model", "algo", "task", "task_args", "reward", "group_size",
                 "prompts_per_step", "mode", "max_staleness", "max_new_tokens", "max_prompt_len",
                 "temperature", "kl_coef", "seed", "chat_template", "oversample",
                 "skip_nonfinite", "param_dtype", "compute_dtype", "rollout_dtype",
                 "behav_weight_cap")


def parse_task_args(text: str) -> dict[str, Any]:
  """"num_digits=1,ops=+" -> {"num_digits": 1, "ops": "+"} (ints and floats converted)."""
  out: dict[str, Any] = {}
  for part in filter(None, (p.strip() for p in text.split(","))):
    if "=" not in part:
      raise ValueError(f"bad task argument {part!r}: expected key=value")
    k, v = part.split("=", 1)
    for cast in (int, float):
      try:
        v = cast(v)
        break
      except ValueError:
        continue
    out[k.strip()] = v
  return out


@dataclasses.dataclass
class Recipe:
  """Built objects: the config with its defaults filled in, mesh, model (config, tokenizer,
  params or None), the training task (reward failures counted), the held-out task and its
  problem indices, configs, notes (e.g. prompts dropped for length; shown when the run
  starts)."""
  config: RunConfig
  mesh_spec: MeshSpec
  model: LoadedModel
  task: Any
  train: TrainConfig
  loop: LoopConfig
  checkpoint: CheckpointConfig
  rollout: RolloutSetup
  eval_task: Any = None
  eval_indices: tuple[int, ...] = ()
  notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RecipeResult(RunResult):
  """`RunResult` plus where the outputs went: run_dir (None without out_dir), outputs (one
  line per artefact), notes (end-of-run remarks such as reward failures)."""
  run_dir: str | None = None
  outputs: list[str] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)


def _build_task(rc: RunConfig, task_args: dict) -> Any:
  if parse_task_spec(rc.task.name) is not None:
    task_args.setdefault("seed", rc.loop.seed)
  return make_task(rc.task.name, rc.task.reward, **task_args)


def _fit_dataset(task: DatasetTask, model: LoadedModel, rc: RunConfig
                 ) -> tuple[DatasetTask, int, int, str | None]:
  """(task without the prompts longer than the bucket, prompt bucket, response budget, a note
  on the dropped rows or None); see `recipe.limits` for the default bucket."""
  tok = model.tokenizer
  new_tokens = rc.loop.max_new_tokens
  if new_tokens is None:
    new_tokens = 64
    if task.has_answers:
      new_tokens = max(4, max(len(tok.encode(str(r[task.answer_key]))) for r in task.rows) + 3)
  prompts = [row[task.prompt_key] for row in task.rows]
  lengths = [len(tok.encode(p, bos=True)) for p in prompts]
  context = None if model.is_preset else model.config.max_seq_len - new_tokens
  max_len = rc.loop.max_prompt_len
  if max_len is None:
    max_len = limits.default_prompt_len(lengths, context)
  note = limits.check_dropped(prompts, lengths, max_len, "--max_prompt_len")
  if note:
    task = task.select([i for i, n in enumerate(lengths) if n <= max_len])
  return task, max_len, new_tokens, note


def build_recipe(rc: RunConfig | RecipeConfig, *, task: Any = None) -> Recipe:
  """Validates `rc`, fills its defaults and builds its pieces (no JAX computation, no mesh).

  Args:
    rc: the config (a `RecipeConfig`, the flat façade, is turned into its tree).
    task: a task object to use instead of `rc.task` (anything with `problem(i) -> Problem`
      and `reward(problem, completion) -> float`; see `tasks.DatasetTask`).

  Raises:
    ValueError: with a message naming the bad input (mesh string, algorithm, group size,
      prompt longer than the context, unknown model or task, missing model files, a reward
      that cannot be imported, out-of-range numbers, output paths that are files).
  """
  rc = rc.run_config() if hasattr(rc, "run_config") else rc
  spec = parse_mesh(rc.distributed.mesh)
  precision = rc.precision.resolve()  # "auto" -> this backend's dtypes, recorded as resolved
  rc = dataclasses.replace(rc, precision=precision)
  limits.check_fake_devices(spec.size, max(len(jax.devices()), len(backend.cpu_devices())),
                            backend.platform())
  for path in (rc.output.out_dir, rc.checkpoint.directory, rc.output.export_hf):
    if path:
      check_directory_path(path, {rc.output.out_dir: "--out_dir", rc.output.export_hf:
                                  "--export_hf"}.get(path, "--checkpoint_dir"))
  if task is not None:  # a Python task object: recorded by name (not reproducible from a file)
    rc = rc.replace(**{"task.name": str(getattr(task, "name", type(task).__name__)),
                       "task.args": ""})
  defaults = TASK_DEFAULTS.get(rc.task.name, ("", None, None))
  task_args = defaults[0] if rc.task.args is None else rc.task.args
  if task is None:
    task = _build_task(rc, parse_task_args(task_args))
  dataset = isinstance(task, DatasetTask)
  extra = "".join(task.texts()) if dataset else ""
  model = load_model(rc.model.name, max_seq_len=64, chat_template=rc.model.chat_template,
                     extra_chars=extra)
  prompt_len, new_tokens = defaults[1:]
  notes = []
  if dataset:
    task, prompt_len, new_tokens, note = _fit_dataset(task, model, rc)
    notes += [n for n in (note, unknown_characters_note(task, model.tokenizer)) if n]
  n_eval = rc.eval.prompts
  eval_task, eval_indices = task, tuple(range(SYNTHETIC_EVAL_START, SYNTHETIC_EVAL_START + n_eval))
  if dataset and rc.eval.every:
    task, eval_task = task.split(n_eval)
    eval_indices = tuple(range(n_eval))
  pick = lambda given, default: given if given is not None else (default or 16)  # noqa: E731
  rc = rc.replace(**{"task.args": task_args,
                     "loop.max_prompt_len": pick(rc.loop.max_prompt_len, prompt_len),
                     "loop.max_new_tokens": pick(rc.loop.max_new_tokens, new_tokens)})
  if model.is_preset:
    model.config = dataclasses.replace(model.config, max_seq_len=rc.loop.seq_len)
  model.config = precision.train_model(model.config)
  # float32 by default: a cast to the checkpoint's bfloat16 would round most of an RL update away
  rc = rc.replace(**{"precision.export_dtype": rc.precision.export_dtype or "float32"})
  if rc.output.export_hf and model.is_preset and model.config.moe is not None:
    raise ValueError(f"--export_hf with --model={rc.model.name}: the tiny MoE preset has no "
                     "Hugging Face equivalent (aux-free routing biases, no q/k norms); export "
                     "works for the dense preset and for Hugging Face models")
  has_answers = getattr(task, "has_answers", True)
  if rc.warmup.steps is None:
    rc = rc.replace(**{"warmup.steps": PRESET_SFT_STEPS if model.is_preset and has_answers
                       else 0})
  elif rc.warmup.steps and not has_answers:
    raise ValueError(f"--sft_steps={rc.warmup.steps}: the supervised warm-up trains on "
                     "reference answers, and the task's rows have none; pass --sft_steps=0")
  train = rc.train.train_config(rc.optim, rc.loop)
  check_lengths(model.config, rc.loop)
  samples = rc.loop.group_size + int(train.advantage.baseline == "median")
  limits.check_memory(model.config, min(rc.loop.micro_batch_groups, rc.loop.prompts_per_step)
                      * samples, rc.loop.seq_len, jax.devices()[0])
  encode_prompt(model.tokenizer, task.problem(0).prompt, rc.loop.max_prompt_len)  # fail early
  identity = {k: rc.get(k) for k in IDENTITY_KEYS}
  identity.update(kl_coef=train.loss.kl_coef, eval_split=n_eval if dataset and rc.eval.every
                  else 0)
  ckpt = dataclasses.replace(rc.checkpoint, identity=json.loads(json.dumps(identity)))
  return Recipe(rc, spec, model, CountingTask(task), train, rc.loop, ckpt, rc.rollout,
                eval_task, eval_indices, notes)


def recipe_mesh(spec: MeshSpec) -> jax.sharding.Mesh:
  """The mesh on the default backend, or on CPU devices when the accelerator has too few
  (CPU devices are faked by `--xla_force_host_platform_device_count`)."""
  if jax.process_count() > 1:  # the mesh spans every process's devices, each a block of it
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    if spec.size != len(devices):
      raise ValueError(
          f"--mesh={spec} has {spec.size} devices but the {jax.process_count()} processes hold "
          f"{len(devices)} ({jax.local_device_count()} each): a multi-process mesh uses every "
          "device; on CPU each process fakes mesh size / --num_processes devices")
    return make_mesh(spec, devices)
  devices = backend.mesh_devices(spec.size)
  if devices[0].platform == "cpu" and backend.platform() != "cpu":
    log.warning("mesh %s needs %d devices, %d %s present: using %d CPU devices", spec,
                spec.size, len(jax.devices()), backend.platform(), spec.size)
  return make_mesh(spec, devices)


def run_name(rc: RunConfig) -> str:
  """A directory-name prefix for the run ("grpo-arithmetic", "grpo-prompts.jsonl", ...)."""
  task = os.path.basename(rc.task.name.split(":", 1)[-1].rstrip("/")) or "task"
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{rc.train.algo}-{task}")


def run_recipe(recipe: Recipe, *, resume: bool = False, messages: bool = True) -> RecipeResult:
  """Warm-up (fresh runs only), GRPO, final artefacts in the run directory (`out_dir`).

  Args:
    recipe: from `build_recipe`.
    resume: continue from the newest usable checkpoint (see `train.loop.checkpoint`).
    messages: print the run's messages (run directory, resume decisions) on stderr.

  Raises:
    ValueError: the run directory holds another run (without `overwrite` / `resume`), both
      `overwrite` and `resume`, a non-empty `export_hf` (checked first), a checkpoint of
      another configuration (`CheckpointMismatchError`), every checkpoint unreadable, or
      `steps` below the resumed step.
    run_lock.RunDirLockedError: a live run holds the run directory or the external
      `--checkpoint_dir`.
    DivergenceError: a non-finite loss or gradient (metrics and plot are still written).
    loop.stop_signals.RunInterrupted: a second SIGINT (the save in flight was flushed).
  """
  rc = recipe.config
  if resume and rc.output.overwrite:
    raise ValueError(RESUME_OVERWRITE)
  if jax.process_count() > 1 and recipe.rollout.rollout != "local":
    raise ValueError(f"--rollout={recipe.rollout.rollout} with {jax.process_count()} "
                     "processes: a multi-process run uses each process's own co-located "
                     "engine; use --rollout=local (Ray rollout is single-process only)")
  # Several processes: process 0 alone claims and writes the run's files (the checkpoints
  # excepted); its errors are raised by every process.
  main = multihost.is_main()
  progress = Progress(rc.loop.steps, rc.output.progress and main, messages=messages and main)
  run_dir = None
  locks = []  # the run directory's, then an external checkpoint directory's

  def claim():
    path = None
    if rc.output.out_dir:
      path, lock = claim_run_dir(rc.output.out_dir, overwrite=rc.output.overwrite,
                                 resume=resume, message=progress.message)
      locks.append(lock)
    ckpt_lock = claim_checkpoint_dir(rc.checkpoint.directory, path, message=progress.message)
    locks.extend([ckpt_lock] if ckpt_lock else [])
    check_export_dir(rc.output.export_hf, path, overwrite=rc.output.overwrite, resume=resume)
    return path

  try:
    run_dir = multihost.run_on_main(claim, "prepare the run directory")
    if run_dir is None and rc.output.out_dir:
      run_dir = os.path.abspath(os.path.expanduser(rc.output.out_dir))
    return _run_claimed(recipe, resume, run_dir, progress)
  except BaseException:
    progress.close()
    raise
  finally:
    for lock in reversed(locks):
      lock.release()


def _run_claimed(recipe: Recipe, resume: bool, run_dir: str | None,
                 progress: Progress) -> RecipeResult:
  """`run_recipe` once the run directory is held."""
  rc, mc, tok = recipe.config, recipe.model.config, recipe.model.tokenizer
  main = multihost.is_main()
  ckpt = recipe.checkpoint
  if ckpt.directory is None and run_dir is not None:
    ckpt = dataclasses.replace(ckpt, directory=os.path.join(run_dir, "checkpoints"))
  config_path = run_dir and os.path.join(run_dir, "config.json")
  config_hooks = []
  for note in recipe.notes:
    progress.message(f"note: {note}")
  settings = reproducible(rc)
  if run_dir is not None and main:
    progress.message(f"run directory: {run_dir}")
    settings[HISTORY_KEY], changed = settings_history(config_path, settings, resume=resume)
    if changed:
      progress.message("settings changed since the previous call: " + ", ".join(
          f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items()))
    if resume and os.path.exists(config_path):
      # written once the checkpoint is restored (a refused resume leaves the file as it was)
      config_hooks.append(WriteOnce(config_path, settings))
    else:
      write_json(config_path, settings)
  progress.message(rc.precision.describe())
  warm = recipe.train.optim.warmup_steps
  if warm and not resume:
    progress.message(f"learning rate: linear warm-up from 0 to {recipe.train.optim.learning_rate:g}"
                     f" over steps 1-{warm + 1} (step 1 trains at 0; --lr_warmup_steps=0 "
                     "starts at the full rate)")
  mesh = recipe_mesh(recipe.mesh_spec)

  def init():
    params = recipe.model.params
    if params is None:
      params = init_params(mc, jax.random.PRNGKey(rc.loop.seed))  # jitted
    if rc.warmup.steps:
      progress.phase(f"supervised warm-up ({rc.warmup.steps} steps)")
    seq = rc.loop.seq_len
    params = supervised_warmup(params, mc, recipe.task, tok, steps=rc.warmup.steps,
                               batch_size=rc.warmup.batch_size,
                               learning_rate=rc.warmup.learning_rate, seq_len=seq)
    # Several processes: the same host values on each, placed on the global mesh from there.
    return jax.device_get(params) if jax.process_count() > 1 else params

  hooks = [recipe.task.metrics_hook] if isinstance(recipe.task, CountingTask) else []
  hooks += config_hooks
  evaluator = None
  if rc.eval.every:
    evaluator = PeriodicEval(mc, recipe.eval_task, tok, recipe.eval_indices,
                             loop_config=recipe.loop, every=rc.eval.every, progress=progress)
    hooks.append(multihost.local_hook(evaluator, mesh) if jax.process_count() > 1
                 else evaluator)
  client = None
  if recipe.rollout.rollout == "ray":
    engine = default_engine_config(recipe.loop, recipe.loop.group_size + int(
        recipe.train.advantage.baseline == "median"), tok.eos_id)
    client = ray_client(recipe.rollout, rc.precision.rollout_model(mc), engine, seed=rc.loop.seed,
                        compile_cache=jax.config.jax_compilation_cache_dir or None)
  loop = RLLoop(mc, recipe.train, recipe.loop, recipe.task, tok, mesh, init_params=init,
                client=client, checkpoint=ckpt, resume=resume, out_dir=run_dir,
                progress=progress, offload=recipe.rollout.offload_config(), step_hooks=hooks,
                precision=rc.precision)
  try:
    result = loop.run()
  except DivergenceError:
    if run_dir and main:
      _plot(recipe, run_dir, [])
    raise
  finally:
    if client is not None:
      client.close()
    if evaluator is not None:
      evaluator.close()
  out = RecipeResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(RunResult)},
                     run_dir=run_dir)
  summary = recipe.task.summary() if isinstance(recipe.task, CountingTask) else None
  out.notes += recipe.notes + ([summary] if summary else [])
  params = result.state.params
  export_hf = rc.output.export_hf
  if jax.process_count() > 1 and (run_dir or export_hf):
    params = multihost.gather_to_host(params)  # a collective: every process takes part
  if run_dir and main:
    write_json(config_path, settings)
    save_params(os.path.join(run_dir, "final_params.npz"), params)
    _plot(recipe, run_dir, result.history)
  if export_hf and not result.preempted and main:
    out.notes.append(_export(recipe, params, run_dir))
  elif export_hf and main:
    out.notes.append(f"run preempted: --export_hf={export_hf} not written (resume to finish)")
  multihost.sync("run_outputs")
  if run_dir and main:
    out.outputs = describe_outputs(run_dir, checkpoint_dir=ckpt.directory,
                                   export_dir=rc.output.export_hf
                                   and os.path.abspath(rc.output.export_hf))
  return out


def _plot(recipe: Recipe, run_dir: str, history: list[dict]) -> None:
  rc = recipe.config
  history = _read_history(run_dir) or history
  plot_history(history, os.path.join(run_dir, "reward_kl.png"),
               (("reward_mean", "eval_reward"), "kl",
                ("mismatch_mean", "mismatch_max", "mismatch_out_frac")),
               title=f"{rc.train.algo} on {rc.task.name} ({rc.loop.mode}, mesh "
                     f"{rc.distributed.mesh})")
  if recipe.rollout.rollout == "ray":
    plot_history(history, os.path.join(run_dir, "offload.png"),
                 ("t_seed", "live_workers", "time_step"),
                 title=f"rollout offload ({rc.rollout.offload}, {rc.rollout.num_workers} Ray "
                       "workers)")


def _export(recipe: Recipe, params, run_dir: str | None) -> str:
  """Writes --export_hf; returns the line saying how much of the update its dtype keeps."""
  # pylint: disable-next=import-outside-toplevel
  from jaxrl_sys.models.hf.export import export_hf, update_survival
  rc, model = recipe.config, recipe.model
  config, files = model.config, None
  if model.is_preset:  # the char tokenizer as an HF tokenizer; its special ids in config.json
    tok = model.tokenizer
    config = dataclasses.replace(config, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id)
    files = tok.hf_tokenizer_files()
  # Checked when the run started (`check_export_dir`): an earlier export of this run, or
  # --overwrite, may be replaced.
  export_hf(rc.output.export_hf, config, params, tokenizer_dir=model.hf_dir, tokenizer_files=files,
            overwrite=True, dtype=rc.precision.export_dtype)
  if run_dir:
    mark_export_dir(rc.output.export_hf, run_dir)
  initial = model.params
  if initial is None:  # a preset starts from its seeded initialisation
    initial = init_params(model.config, jax.random.PRNGKey(rc.loop.seed))
  return "--export_hf: " + update_survival(initial, params, rc.precision.export_dtype).describe()


def _read_history(out_dir: str) -> list[dict]:
  path = os.path.join(out_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  rows = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        rows[row["step"]] = row  # a resumed run rewrites later steps
  return [rows[k] for k in sorted(rows)]

"""The end-to-end GRPO recipe behind `python -m experiments.grpo`, as a frozen config.

Default: a tiny dense model on 1-digit addition, a short supervised warm-up that leaves the
reward mid-range, then GRPO; it learns visibly in about a minute on a 2-core CPU.
`build_recipe` validates everything (mesh, algorithm, group size, lengths, task, reward,
model files) before any work and fills the task- and model-dependent defaults (`None` fields);
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
import numpy as np

from jaxrl_sys.models import init_params
from jaxrl_sys.sharding import MeshSpec, make_mesh, parse_mesh
from jaxrl_sys.tasks import CountingTask, DatasetTask, make_task, parse_task_spec
from jaxrl_sys.train.config import (ALGOS, CheckpointConfig, LoopConfig, OptimConfig, TrainConfig,
                                    train_config_for_algo)
from jaxrl_sys.train.config_file import reproducible
from jaxrl_sys.train.groups import encode_prompt
from jaxrl_sys.train.guard import DivergenceError
from jaxrl_sys.train.loop import RLLoop, RunResult
from jaxrl_sys.train.rollout_setup import check_lengths, default_engine_config
from jaxrl_sys.train.metrics_log import Progress, plot_history
from jaxrl_sys.train.periodic_eval import SYNTHETIC_EVAL_START, PeriodicEval
from jaxrl_sys.train.presets import LoadedModel, load_model
from jaxrl_sys.train.rollout_setup import RolloutSetup, ray_client
from jaxrl_sys.train.run_dir import (check_directory_path, describe_outputs, prepare_run_dir,
                                     write_json)
from jaxrl_sys.train.supervised import supervised_warmup

log = logging.getLogger(__name__)

# Built-in tasks: (task_args, max_prompt_len, max_new_tokens) used when the config leaves them
# None. The tiny presets' warm-up steps when `sft_steps` is None (a user's model gets none).
TASK_DEFAULTS = {"arithmetic": ("num_digits=1,ops=+", 8, 4), "countdown": ("", 16, 8)}
PRESET_SFT_STEPS = 60
# Identity of a run for `--resume` (CheckpointConfig.identity): what is trained, and on what.
IDENTITY_KEYS = ("model", "algo", "task", "task_args", "reward", "group_size",
                 "prompts_per_step", "mode", "max_staleness", "max_new_tokens", "max_prompt_len",
                 "temperature", "kl_coef", "seed", "chat_template", "oversample",
                 "skip_nonfinite")


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
  """Everything `experiments.grpo` exposes as flags (see its --help for each field); None
  means "the task's / model's default" (filled in by `build_recipe`)."""
  mesh: str = "1x1"
  algo: str = "grpo"
  model: str = "tiny"
  task: str = "arithmetic"
  task_args: str | None = None
  reward: str | None = None
  group_size: int = 4
  prompts_per_step: int = 64
  steps: int = 100
  mode: str = "sync"
  max_staleness: int = 0
  micro_batch_groups: int = 16
  dynamic_micro_batching: bool = True
  max_new_tokens: int | None = None
  max_prompt_len: int | None = None
  temperature: float = 1.0
  oversample: float = 1.0
  learning_rate: float = 1e-3
  lr_warmup_steps: int = 5
  kl_coef: float | None = None
  skip_nonfinite: bool = False
  sft_steps: int | None = None
  sft_learning_rate: float = 3e-3
  sft_batch_size: int = 32
  chat_template: bool = True
  eval_every: int = 0
  eval_prompts: int = 32
  checkpoint_dir: str | None = None
  save_every: int = 10
  keep_checkpoints: int = 3
  seed: int = 0
  out_dir: str | None = None
  overwrite: bool = False
  export_hf: str | None = None
  progress: bool = True
  rollout: str = "local"
  local_workers: int = 0
  num_workers: int = 2
  ray_address: str | None = None
  weight_store: str | None = None
  preempt_trace: str | None = None
  trace_time_scale: float = 1.0 / 60.0
  chaos_kill_every: float = 0.0
  chaos_restart_after: float = 2.0
  max_request_failures: int = 5
  worker_token_delay: float = 0.0
  worker_cpus: float = 1.0
  worker_gpus: float = 0.0
  offload: str = "off"
  t_seed_init: float = 2.0


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
  problem indices, configs."""
  config: RecipeConfig
  mesh_spec: MeshSpec
  model: LoadedModel
  task: Any
  train: TrainConfig
  loop: LoopConfig
  checkpoint: CheckpointConfig
  rollout: RolloutSetup
  eval_task: Any = None
  eval_indices: tuple[int, ...] = ()


@dataclasses.dataclass
class RecipeResult(RunResult):
  """`RunResult` plus where the outputs went: run_dir (None without out_dir), outputs (one
  line per artefact), notes (end-of-run remarks such as reward failures)."""
  run_dir: str | None = None
  outputs: list[str] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)


def _check_ranges(rc: RecipeConfig) -> None:
  checks = [(rc.steps >= 1, f"--steps={rc.steps}: nothing to train; give --steps >= 1"),
            (rc.sft_steps is None or rc.sft_steps >= 0,
             f"--sft_steps={rc.sft_steps} must be >= 0 (0 = no supervised warm-up)"),
            (rc.sft_batch_size >= 1, f"--sft_batch_size={rc.sft_batch_size} must be >= 1"),
            (rc.sft_learning_rate > 0, f"--sft_learning_rate={rc.sft_learning_rate} must be > 0"),
            (rc.eval_every >= 0, f"--eval_every={rc.eval_every} must be >= 0 (0 = off)"),
            (rc.eval_prompts >= 1, f"--eval_prompts={rc.eval_prompts} must be >= 1"),
            (rc.prompts_per_step >= 1, f"--prompts_per_step={rc.prompts_per_step} must be >= 1"),
            (rc.learning_rate > 0, f"--learning_rate={rc.learning_rate} must be > 0")]
  for ok, message in checks:
    if not ok:
      raise ValueError(message)
  for flag in ("out_dir", "checkpoint_dir", "export_hf"):
    if getattr(rc, flag):
      check_directory_path(getattr(rc, flag), f"--{flag}")


def _build_task(rc: RecipeConfig, task_args: dict) -> Any:
  if parse_task_spec(rc.task) is not None:
    task_args.setdefault("seed", rc.seed)
  return make_task(rc.task, rc.reward, **task_args)


def _dataset_lengths(task: DatasetTask, tok) -> tuple[int, int]:
  prompt = max(len(tok.encode(p.prompt, bos=True)) for p in map(task.problem, range(len(task))))
  if task.has_answers:
    answer = max(len(tok.encode(str(r[task.answer_key]))) for r in task.rows)
    return prompt, max(4, answer + 3)
  return prompt, 64


def build_recipe(rc: RecipeConfig, *, task: Any = None) -> Recipe:
  """Validates `rc`, fills its defaults and builds its pieces (no JAX computation, no mesh).

  Args:
    rc: the config.
    task: a task object to use instead of `rc.task` (anything with `problem(i) -> Problem`
      and `reward(problem, completion) -> float`; see `tasks.DatasetTask`).

  Raises:
    ValueError: with a message naming the bad input (mesh string, algorithm, group size,
      prompt longer than the context, unknown model or task, missing model files, a reward
      that cannot be imported, out-of-range numbers, output paths that are files).
  """
  spec = parse_mesh(rc.mesh)
  if rc.algo not in ALGOS:
    raise ValueError(f"unknown --algo {rc.algo!r}; choose one of {ALGOS}")
  if rc.group_size < 2:
    raise ValueError(
        f"--group_size={rc.group_size} with --algo={rc.algo}: GRPO-family advantages compare "
        "samples of the same prompt, so each group needs at least 2 samples")
  _check_ranges(rc)
  if task is not None:  # a Python task object: recorded by name (not reproducible from a file)
    rc = dataclasses.replace(rc, task=str(getattr(task, "name", type(task).__name__)),
                             task_args="")
  defaults = TASK_DEFAULTS.get(rc.task, ("", None, None))
  task_args = defaults[0] if rc.task_args is None else rc.task_args
  if task is None:
    task = _build_task(rc, parse_task_args(task_args))
  dataset = isinstance(task, DatasetTask)
  eval_task, eval_indices = task, tuple(range(SYNTHETIC_EVAL_START,
                                              SYNTHETIC_EVAL_START + rc.eval_prompts))
  if dataset and rc.eval_every:
    task, eval_task = task.split(rc.eval_prompts)
    eval_indices = tuple(range(rc.eval_prompts))
  extra = "".join(task.texts()) if dataset else ""
  model = load_model(rc.model, max_seq_len=64, chat_template=rc.chat_template, extra_chars=extra)
  prompt_len, new_tokens = defaults[1:]
  if dataset:
    prompt_len, new_tokens = _dataset_lengths(task, model.tokenizer)
  rc = dataclasses.replace(
      rc, task_args=task_args,
      max_prompt_len=rc.max_prompt_len or prompt_len or 16,
      max_new_tokens=rc.max_new_tokens or new_tokens or 16)
  if model.is_preset:
    model.config = dataclasses.replace(model.config,
                                       max_seq_len=rc.max_prompt_len + rc.max_new_tokens)
  if rc.export_hf and model.is_preset and model.config.moe is not None:
    raise ValueError(f"--export_hf with --model={rc.model}: the tiny MoE preset has no Hugging "
                     "Face equivalent (aux-free routing biases, no q/k norms); export works for "
                     "the dense preset and for Hugging Face models")
  has_answers = getattr(task, "has_answers", True)
  if rc.sft_steps is None:
    rc = dataclasses.replace(rc, sft_steps=PRESET_SFT_STEPS if model.is_preset and has_answers
                             else 0)
  elif rc.sft_steps and not has_answers:
    raise ValueError(f"--sft_steps={rc.sft_steps}: the supervised warm-up trains on reference "
                     "answers, and the task's rows have none; pass --sft_steps=0")
  decoupled = rc.mode != "sync"
  optim = OptimConfig(learning_rate=rc.learning_rate, warmup_steps=rc.lr_warmup_steps,
                      skip_nonfinite=rc.skip_nonfinite)
  train = train_config_for_algo(rc.algo, decoupled=decoupled, kl_coef=rc.kl_coef, optim=optim,
                                temperature=rc.temperature)
  loop = LoopConfig(steps=rc.steps, prompts_per_step=rc.prompts_per_step,
                    group_size=rc.group_size, mode=rc.mode, max_staleness=rc.max_staleness,
                    micro_batch_groups=rc.micro_batch_groups,
                    dynamic_micro_batching=rc.dynamic_micro_batching,
                    max_new_tokens=rc.max_new_tokens, max_prompt_len=rc.max_prompt_len,
                    temperature=rc.temperature, oversample=rc.oversample, seed=rc.seed,
                    local_workers=rc.local_workers)
  check_lengths(model.config, loop)
  encode_prompt(model.tokenizer, task.problem(0).prompt, rc.max_prompt_len)  # fail early
  identity = {k: getattr(rc, k) for k in IDENTITY_KEYS}
  identity.update(kl_coef=train.loss.kl_coef, eval_split=rc.eval_prompts if dataset and
                  rc.eval_every else 0)
  ckpt = CheckpointConfig(directory=rc.checkpoint_dir, save_every=rc.save_every,
                          keep=rc.keep_checkpoints, identity=json.loads(json.dumps(identity)))
  # RolloutSetup's fields are RecipeConfig fields of the same names (flat, flag-facing).
  rollout = RolloutSetup(**{f.name: getattr(rc, f.name) for f in dataclasses.fields(RolloutSetup)
                            if hasattr(rc, f.name)})
  return Recipe(rc, spec, model, CountingTask(task), train, loop, ckpt, rollout, eval_task,
                eval_indices)


def recipe_mesh(spec: MeshSpec) -> jax.sharding.Mesh:
  """The mesh on the default backend, or on CPU devices when the accelerator has too few
  (CPU devices are faked by `--xla_force_host_platform_device_count`)."""
  devices = jax.devices()
  if spec.size > len(devices) and jax.default_backend() != "cpu":
    cpus = jax.devices("cpu")
    if len(cpus) >= spec.size:
      log.warning("mesh %s needs %d devices, %d %s present: using %d CPU devices", spec,
                  spec.size, len(devices), jax.default_backend(), spec.size)
      devices = cpus
  return make_mesh(spec, devices)


def run_name(rc: RecipeConfig) -> str:
  """A directory-name prefix for the run ("grpo-arithmetic", "grpo-prompts.jsonl", ...)."""
  task = os.path.basename(rc.task.split(":", 1)[-1].rstrip("/")) or "task"
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{rc.algo}-{task}")


def run_recipe(recipe: Recipe, *, resume: bool = False, messages: bool = True) -> RecipeResult:
  """Warm-up (fresh runs only), GRPO, final artefacts in the run directory (`out_dir`).

  Args:
    recipe: from `build_recipe`.
    resume: continue from the newest usable checkpoint (see `train.checkpoint`).
    messages: print the run's messages (run directory, resume decisions) on stderr.

  Raises:
    ValueError: the run directory holds another run (without `overwrite` / `resume`), or a
      checkpoint belongs to another configuration (`CheckpointMismatchError`).
    DivergenceError: a non-finite loss or gradient (metrics and plot are still written).
  """
  rc, mc, tok = recipe.config, recipe.model.config, recipe.model.tokenizer
  run_dir = prepare_run_dir(rc.out_dir, overwrite=rc.overwrite, resume=resume) if (
      rc.out_dir) else None
  ckpt = recipe.checkpoint
  if ckpt.directory is None and run_dir is not None:
    ckpt = dataclasses.replace(ckpt, directory=os.path.join(run_dir, "checkpoints"))
  progress = Progress(rc.steps, rc.progress, messages=messages)
  config_path = run_dir and os.path.join(run_dir, "config.json")
  if run_dir is not None:
    progress.message(f"run directory: {run_dir}")
    if not (resume and os.path.exists(config_path)):  # a resumed run's is replaced at the end
      write_json(config_path, reproducible(dataclasses.asdict(rc)))
  mesh = recipe_mesh(recipe.mesh_spec)

  def init():
    params = recipe.model.params
    if params is None:
      params = jax.jit(init_params, static_argnums=0)(mc, jax.random.PRNGKey(rc.seed))
    if rc.sft_steps:
      progress.phase(f"supervised warm-up ({rc.sft_steps} steps)")
    seq = rc.max_prompt_len + rc.max_new_tokens
    return supervised_warmup(params, mc, recipe.task, tok, steps=rc.sft_steps,
                             batch_size=rc.sft_batch_size, learning_rate=rc.sft_learning_rate,
                             seq_len=seq)

  hooks = [recipe.task.metrics_hook] if isinstance(recipe.task, CountingTask) else []
  evaluator = None
  if rc.eval_every:
    evaluator = PeriodicEval(mc, recipe.eval_task, tok, recipe.eval_indices,
                             loop_config=recipe.loop, every=rc.eval_every, progress=progress)
    hooks.append(evaluator)
  client = None
  if recipe.rollout.rollout == "ray":
    engine = default_engine_config(recipe.loop, recipe.loop.group_size + int(
        recipe.train.advantage.baseline == "median"), tok.eos_id)
    client = ray_client(recipe.rollout, mc, engine, seed=rc.seed,
                        compile_cache=jax.config.jax_compilation_cache_dir or None)
  loop = RLLoop(mc, recipe.train, recipe.loop, recipe.task, tok, mesh, init_params=init,
                client=client, checkpoint=ckpt, resume=resume, out_dir=run_dir,
                progress=progress, offload=recipe.rollout.offload_config(), step_hooks=hooks)
  try:
    result = loop.run()
  except DivergenceError:
    if run_dir:
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
  out.notes += [summary] if summary else []
  if run_dir:
    write_json(config_path, reproducible(dataclasses.asdict(rc)))
    save_params(os.path.join(run_dir, "final_params.npz"), result.state.params)
    _plot(recipe, run_dir, result.history)
  if rc.export_hf and not result.preempted:
    _export(recipe, result.state.params)
  elif rc.export_hf:
    out.notes.append(f"run preempted: --export_hf={rc.export_hf} not written (resume to finish)")
  if run_dir:
    out.outputs = describe_outputs(run_dir, checkpoint_dir=ckpt.directory,
                                   export_dir=rc.export_hf and os.path.abspath(rc.export_hf))
  return out


def _plot(recipe: Recipe, run_dir: str, history: list[dict]) -> None:
  rc = recipe.config
  history = _read_history(run_dir) or history
  plot_history(history, os.path.join(run_dir, "reward_kl.png"),
               (("reward_mean", "eval_reward"), "kl"),
               title=f"{rc.algo} on {rc.task} ({rc.mode}, mesh {rc.mesh})")
  if recipe.rollout.rollout == "ray":
    plot_history(history, os.path.join(run_dir, "offload.png"),
                 ("t_seed", "live_workers", "time_step"),
                 title=f"rollout offload ({rc.offload}, {rc.num_workers} Ray workers)")


def _export(recipe: Recipe, params) -> None:
  from jaxrl_sys.models import export_hf  # pylint: disable=import-outside-toplevel
  rc, model = recipe.config, recipe.model
  config, files = model.config, None
  if model.is_preset:  # the char tokenizer as an HF tokenizer; its special ids in config.json
    tok = model.tokenizer
    config = dataclasses.replace(config, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id)
    files = tok.hf_tokenizer_files()
  export_hf(rc.export_hf, config, params, tokenizer_dir=model.hf_dir, tokenizer_files=files,
            overwrite=rc.overwrite)


def save_params(path: str, params) -> None:
  """Writes the parameters as a flat .npz ("layers/attn/wq" -> array), no pickles."""
  flat = {"/".join(str(getattr(k, "key", k)) for k in kp): np.asarray(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  tmp = path + ".tmp.npz"
  np.savez(tmp, **flat)
  os.replace(tmp, path)


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

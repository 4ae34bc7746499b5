"""A built recipe run in its own directory: `run_recipe` (warm-up, GRPO, final artefacts), the
mesh it trains on (`recipe_mesh`) and the run directory's name (`run_name`).

`run_recipe` claims the run directory (a lock; several processes: process 0 writes the run's
files), writes config.json, builds the run's pieces once (the mesh, the training and
evaluation rollout sessions, the offload controller's hooks, the periodic evaluator, the loop;
`recipe.build`), runs the loop, closes the sessions and writes the final parameters, plots and
the Hugging Face export.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re

import jax

from jaxrl_sys import backend
from jaxrl_sys.models import init_params, lora
from jaxrl_sys.rollout.clock import WALL
from jaxrl_sys.sharding import MeshSpec, make_mesh
from jaxrl_sys.tasks import CountingTask
from jaxrl_sys.train.multihost import collectives as multihost
from jaxrl_sys.train.loop.guard import DivergenceError
from jaxrl_sys.train.loop.metrics_log import Progress, plot_history
from jaxrl_sys.train.loop.periodic_eval import PeriodicEval
from jaxrl_sys.train.loop.rl_loop import RunResult
from jaxrl_sys.train.loop.supervised import supervised_warmup
from jaxrl_sys.train.recipe import offload as offload_lib
from jaxrl_sys.train.recipe.build import Recipe, eval_session, make_loop, rollout_session
from jaxrl_sys.train.recipe.config_file import (HISTORY_KEY, WriteOnce, reproducible,
                                                settings_history)
from jaxrl_sys.train.recipe.run_config import RunConfig
from jaxrl_sys.train.precision import cast_floating
from jaxrl_sys.train.recipe.run_dir import (RESUME_OVERWRITE, check_export_dir,
                                            claim_checkpoint_dir, claim_output_dir,
                                            claim_run_dir, describe_outputs,
                                            load_tree, local_store_dir,
                                            mark_export_dir, save_params, save_tree,
                                            write_json)

log = logging.getLogger(__name__)
# LoRA: the frozen base a run made (random init, supervised warm-up), beside its checkpoints.
LORA_BASE_FILE = "lora_base.safetensors"


@dataclasses.dataclass
class RecipeResult:
  """A recipe's run: `run`, the loop's `RunResult` (final state, metrics history, whether it
  was preempted, the step it resumed from, the stop signal), and where the outputs went:
  run_dir (None without out_dir), outputs (one line per artefact), notes (end-of-run remarks
  such as reward failures)."""
  run: RunResult
  run_dir: str | None = None
  outputs: list[str] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)


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
  # Several processes: process 0 alone claims and writes the run's files (the checkpoints
  # excepted); its errors are raised by every process.
  main = multihost.is_main()
  progress = Progress(rc.loop.steps, rc.output.progress and main, messages=messages and main)
  run_dir = None
  locks = []  # the run directory's, then those of the other directories it writes

  def claim():
    path = None
    if rc.output.out_dir:
      path, lock = claim_run_dir(rc.output.out_dir, overwrite=rc.output.overwrite,
                                 resume=resume, message=progress.message)
      locks.append(lock)
    check_export_dir(rc.output.export_hf, path, overwrite=rc.output.overwrite, resume=resume)
    check_export_dir(rc.output.export_peft, path, overwrite=rc.output.overwrite, resume=resume,
                     flag="--export_peft")
    # every other directory the run writes is held too: another run pointed at one of them is
    # refused while this one lives
    for claimed in (claim_checkpoint_dir(rc.checkpoint.directory, path, message=progress.message),
                    claim_output_dir(rc.output.export_hf, "--export_hf", message=progress.message),
                    claim_output_dir(rc.output.export_peft, "--export_peft",
                                     message=progress.message),
                    claim_output_dir(local_store_dir(rc.rollout.weight_store),
                                     "--weight_store=tensorstore:", message=progress.message)):
      locks.extend([claimed] if claimed else [])
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
  rc, mc, tok = recipe.config, recipe.plan.train_model, recipe.model.tokenizer
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
  warm = recipe.plan.train.optim.warmup_steps
  if warm and not resume:
    progress.message(f"learning rate: linear warm-up from 0 to "
                     f"{recipe.plan.train.optim.learning_rate:g} over steps 1-{warm + 1} (step 1 "
                     "trains at 0; --lr_warmup_steps=0 starts at the full rate)")
  mesh = recipe_mesh(recipe.mesh_spec)

  base_file = ckpt.directory and os.path.join(ckpt.directory, LORA_BASE_FILE)

  def init():
    if mc.lora is not None and resume and base_file and os.path.exists(base_file):
      return load_tree(base_file)  # LoRA, resumed: the base the fresh run wrote (bit exact)
    params = recipe.model.params
    if params is None:
      params = init_params(lora.without_lora(mc), jax.random.PRNGKey(rc.loop.seed))  # jitted
    if rc.warmup.steps:
      progress.phase(f"supervised warm-up ({rc.warmup.steps} steps)")
    seq = rc.loop.seq_len
    params = supervised_warmup(params, lora.without_lora(mc), recipe.task, tok,
                               steps=rc.warmup.steps, batch_size=rc.warmup.batch_size,
                               learning_rate=rc.warmup.learning_rate, seq_len=seq)
    if mc.lora is not None:
      # The frozen base in its checkpoint's dtype. One the run made (random init, warm-up) is
      # written once beside the checkpoints: a resumed run reads it instead of remaking it.
      params = cast_floating(params, recipe.model.source_dtype)
      if base_file and (recipe.model.is_preset or rc.warmup.steps):
        multihost.run_on_main(lambda: _write_base(base_file, params), "write the LoRA base")
    # Several processes: the same host values on each, placed on the global mesh from there.
    return jax.device_get(params) if jax.process_count() > 1 else params

  hooks = [recipe.task.metrics_hook] if isinstance(recipe.task, CountingTask) else []
  hooks += config_hooks
  # built once here, closed once below
  sessions = [rollout_session(recipe, message=progress.message)]

  def close_sessions():
    while sessions:
      sessions.pop().close()

  try:
    resumables = {}
    offload = recipe.rollout.offload_config()
    if offload is not None:  # its metrics go into the row before the other hooks read it
      controller = offload_lib.OffloadHooks(offload, sessions[0], WALL)
      controller.attach()
      hooks.insert(0, controller)
      resumables[offload_lib.KEY] = controller
    if rc.eval.every:
      sessions.append(eval_session(recipe))
      evaluator = PeriodicEval(sessions[-1], recipe.eval_task, tok, recipe.eval_indices,
                               plan=recipe.plan, every=rc.eval.every, progress=progress)
      hooks.append(multihost.local_hook(evaluator, mesh) if recipe.plan.processes > 1
                   else evaluator)
    loop = make_loop(recipe, mesh, sessions[0], init_params=init, checkpoint=ckpt,
                     resume=resume, out_dir=run_dir, progress=progress, step_hooks=hooks,
                     resumables=resumables)
    # The run's signal handlers stay while its rollout workers shut down and its outputs are
    # written: a Ctrl-C then is the run's second SIGINT, never a KeyboardInterrupt inside a
    # thread join, a GC callback or the final parameters' write.
    with loop.signals.installed():
      try:
        result = loop.run()
      finally:
        close_sessions()
      return _write_outputs(recipe, result, run_dir, ckpt.directory, config_path, settings)
  except DivergenceError:
    if run_dir and main:
      _plot(recipe, run_dir, [])
    raise
  finally:
    close_sessions()


def _write_outputs(recipe: Recipe, result, run_dir: str | None, checkpoint_dir: str | None,
                   config_path: str | None, settings: dict) -> RecipeResult:
  """The run's outputs once its loop ended: the settings, final parameters and plot in
  `run_dir`, the HF / PEFT exports, and their description."""
  rc, mc = recipe.config, recipe.plan.train_model
  main = multihost.is_main()
  out = RecipeResult(result, run_dir=run_dir)
  summary = recipe.task.summary() if isinstance(recipe.task, CountingTask) else None
  out.notes += recipe.notes + ([summary] if summary else [])
  params, adapters = result.state.params, None
  if result.state.base is not None:  # LoRA: the policy is the base merged with the adapters
    adapters = result.state.params
    params = lora.merge_lora(result.state.base, adapters, config=mc, dtype="float32")
  export_hf = rc.output.export_hf
  if jax.process_count() > 1 and (run_dir or export_hf or rc.output.export_peft):
    params = multihost.gather_to_host(params)  # a collective: every process takes part
    adapters = adapters if adapters is None else multihost.gather_to_host(adapters)
  if run_dir and main:
    write_json(config_path, settings)
    save_params(os.path.join(run_dir, "final_params.npz"), params)
    _plot(recipe, run_dir, result.history)
  if export_hf and not result.preempted and main:
    out.notes.append(_export(recipe, params, run_dir))
  elif export_hf and main:
    out.notes.append(f"run preempted: --export_hf={export_hf} not written (resume to finish)")
  if rc.output.export_peft and not result.preempted and main:
    _export_peft(recipe, adapters, result.state.base, run_dir)
  elif rc.output.export_peft and main:
    out.notes.append(f"run preempted: --export_peft={rc.output.export_peft} not written "
                     "(resume to finish)")
  multihost.sync("run_outputs")
  if run_dir and main:
    out.outputs = describe_outputs(run_dir, checkpoint_dir=checkpoint_dir,
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
  if recipe.agentic:
    plot_history(history, os.path.join(run_dir, "agent.png"),
                 (("episode_success", "eval_reward"), "episode_turns",
                  ("tool_error_frac", "prefetch_hit_frac")),
                 title=f"episodes on {rc.task.name} (max {rc.agent.max_turns} turns)")
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
  export_hf(rc.output.export_hf, lora.without_lora(config), params, tokenizer_dir=model.hf_dir,
            tokenizer_files=files, overwrite=True, dtype=rc.precision.export_dtype)
  if run_dir:
    mark_export_dir(rc.output.export_hf, run_dir)
  initial = model.params
  if initial is None:  # a preset starts from its seeded initialisation
    initial = init_params(recipe.plan.train_model, jax.random.PRNGKey(rc.loop.seed))
  return "--export_hf: " + update_survival(initial, params, rc.precision.export_dtype).describe()


def _write_base(path: str, params) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  save_tree(path, params)


def _export_peft(recipe: Recipe, adapters, base, run_dir: str | None) -> None:
  """The adapters as a PEFT directory; a preset's base (no Hugging Face directory of its own)
  is exported beside them, in base/, and named as the adapters' base model."""
  from jaxrl_sys.models.hf.peft import export_peft  # pylint: disable=import-outside-toplevel
  rc, model = recipe.config, recipe.model
  out = os.path.abspath(rc.output.export_peft)
  base_model = model.hf_dir
  export_peft(out, recipe.plan.train_model, adapters,
              base_model=base_model or os.path.join(out, "base"), overwrite=True)
  if base_model is None:
    from jaxrl_sys.models import export_hf  # pylint: disable=import-outside-toplevel
    tok = model.tokenizer
    config = dataclasses.replace(lora.without_lora(model.config), bos_token_id=tok.bos_id,
                                 eos_token_id=tok.eos_id)
    export_hf(os.path.join(out, "base"), config, multihost.gather_to_host(base)
              if jax.process_count() > 1 else base, tokenizer_files=tok.hf_tokenizer_files(),
              overwrite=True, dtype=rc.precision.export_dtype)
  if run_dir:
    mark_export_dir(out, run_dir)


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

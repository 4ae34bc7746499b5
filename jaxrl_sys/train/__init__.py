"""Trainer, in four sub-packages; imports run recipe -> loop -> multihost -> step (see
docs/architecture.md).

`step/`, the pure core:
- `TrainState(step, params, opt_state, ref_params, moe_state, rng)`, `init_train_state`,
  `abstract_state`, `state_shardings`, `with_shardings` (restore targets on any mesh).
- `train_step(state, batch[micro, rows, T]) -> (state, metrics)` and its pieces `init_accum`,
  `accumulate`, `apply` (global normalisation across micro-batches), and `fused_step` (a step of
  one micro-batch as one program); `make_train_fns` jits them on a mesh
  (`TrainFns.step / init_accum / accumulate / apply / fused_step / put_batch`);
  `train_programs` builds the optimizer, schedule, abstract state and `TrainFns` once per
  process for equal configurations (`TrainPrograms`), so a second loop reuses the compiled step.
- `TrainBatch`, `Sample`, `pack`, `stack`: completions -> fixed-shape padded arrays.
- `make_optimizer` (clip -> AdamW(schedule) -> ESS scale), `make_schedule`; `TrainConfig`
  (+ `train_config_for_algo`), `OptimConfig`.
- `PrecisionConfig` (float32 masters and moments, compute and rollout dtypes;
  `rollout_weights` casts the masters for publishing).

`loop/`, the side effects:
- `RLLoop(plan, programs, client, task, tokenizer, ...).run() -> RunResult`: prompts ->
  rollout (a `rollout.RolloutSession` the caller built) -> rewards -> advantages -> train ->
  publish -> checkpoint; sync / one_off / async (AReaL staleness), dynamic micro-batching,
  SIGTERM = save and stop. `LoopConfig`; `RunPlan`, the run's arithmetic computed once.
- `Checkpointer`: orbax async saves, keep-last-K, fingerprints, fallback from corrupt steps;
  `CheckpointMismatchError` when a checkpoint belongs to another run configuration.
  `CheckpointConfig`.
- `DivergenceGuard` / `DivergenceError`: a non-finite loss or gradient stops the run.
- `CollapseWatch` / `collapse_onset` / `CollapseRule`: a policy collapse (reward fallen, no
  learning signal left) is reported once (docs/algorithms.md).
- `RolloutBuffer`: in-flight groups and partial requests, serialised as arrays + JSON.
- `supervised_warmup`, `evaluate`, `PeriodicEval`, `MetricsLogger`, `Progress`, `plot_history`.

`multihost/`, process-group plumbing (several JAX processes): joining the job
(`multihost.job.initialize`, `DistributedConfig`, the watchdog) and the collectives and each
process's view of a mesh (`multihost.collectives`).

`recipe/`, the composition root:
- `RunConfig`: every run setting, one documented field of one section; the flags of
  `python -m experiments.grpo` are generated from it. `RecipeConfig`: its flat façade.
- `build_recipe`, `run_recipe`: what `python -m experiments.grpo` runs, in its own run
  directory (`prepare_run_dir`, `new_run_dir`); `load_model`; `rollout_session`,
  `eval_session`, `make_loop`: a recipe's pieces, each built in one place.

Every name below is imported on first access (module `__getattr__`), so importing
`jaxrl_sys.train.step.config` loads neither orbax, the loop nor the rollout wings.
"""
from jaxrl_sys._lazy import lazy_attributes

_NAMES = {
    "ALGOS": "jaxrl_sys.train.step.config",
    "Accum": "jaxrl_sys.train.step.update",
    "CheckpointConfig": "jaxrl_sys.train.loop.config",
    "CheckpointMismatchError": "jaxrl_sys.train.loop.compat",
    "Checkpointer": "jaxrl_sys.train.loop.checkpoint",
    "CollapseRule": "jaxrl_sys.train.loop.collapse",
    "CollapseWatch": "jaxrl_sys.train.loop.collapse",
    "DivergenceError": "jaxrl_sys.train.loop.guard",
    "DivergenceGuard": "jaxrl_sys.train.loop.guard",
    "LoopConfig": "jaxrl_sys.train.loop.config",
    "MODES": "jaxrl_sys.train.loop.config",
    "MetricsLogger": "jaxrl_sys.train.loop.metrics_log",
    "OptimConfig": "jaxrl_sys.train.step.config",
    "PeriodicEval": "jaxrl_sys.train.loop.periodic_eval",
    "PrecisionConfig": "jaxrl_sys.train.precision",
    "Progress": "jaxrl_sys.train.loop.metrics_log",
    "RLLoop": "jaxrl_sys.train.loop.rl_loop",
    "RecipeConfig": "jaxrl_sys.train.recipe.run_config",
    "RecipeResult": "jaxrl_sys.train.recipe.run",
    "Restored": "jaxrl_sys.train.loop.checkpoint",
    "RolloutBuffer": "jaxrl_sys.train.loop.buffer",
    "RunPlan": "jaxrl_sys.train.loop.plan",
    "RunConfig": "jaxrl_sys.train.recipe.run_config",
    "RunResult": "jaxrl_sys.train.loop.rl_loop",
    "Sample": "jaxrl_sys.train.step.batch",
    "TrainBatch": "jaxrl_sys.train.step.batch",
    "TrainConfig": "jaxrl_sys.train.step.config",
    "TrainFns": "jaxrl_sys.train.step.update",
    "TrainPrograms": "jaxrl_sys.train.step.programs",
    "TrainState": "jaxrl_sys.train.step.state",
    "abstract_state": "jaxrl_sys.train.step.state",
    "accumulate": "jaxrl_sys.train.step.update",
    "apply": "jaxrl_sys.train.step.update",
    "build_recipe": "jaxrl_sys.train.recipe.build",
    "collapse_onset": "jaxrl_sys.train.loop.collapse",
    "evaluate": "jaxrl_sys.train.loop.evaluate",
    "fingerprint": "jaxrl_sys.train.loop.checkpoint",
    "fused_step": "jaxrl_sys.train.step.update",
    "init_accum": "jaxrl_sys.train.step.update",
    "init_train_state": "jaxrl_sys.train.step.state",
    "load_model": "jaxrl_sys.train.recipe.presets",
    "make_optimizer": "jaxrl_sys.train.step.optim",
    "make_schedule": "jaxrl_sys.train.step.optim",
    "make_train_fns": "jaxrl_sys.train.step.update",
    "new_run_dir": "jaxrl_sys.train.recipe.run_dir",
    "pack": "jaxrl_sys.train.step.batch",
    "plot_history": "jaxrl_sys.train.loop.metrics_log",
    "prepare_run_dir": "jaxrl_sys.train.recipe.run_dir",
    "rollout_weights": "jaxrl_sys.train.precision",
    "run_recipe": "jaxrl_sys.train.recipe.run",
    "stack": "jaxrl_sys.train.step.batch",
    "state_shardings": "jaxrl_sys.train.step.state",
    "supervised_warmup": "jaxrl_sys.train.loop.supervised",
    "token_logprobs": "jaxrl_sys.train.step.update",
    "train_config_for_algo": "jaxrl_sys.train.step.config",
    "train_programs": "jaxrl_sys.train.step.programs",
    "train_step": "jaxrl_sys.train.step.update",
    "with_shardings": "jaxrl_sys.train.step.state",
}
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
__all__ = sorted(_NAMES)

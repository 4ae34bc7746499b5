"""Trainer, in three sub-packages (imports run recipe -> loop -> step; see docs/architecture.md).

`step/`, the pure core:
- `TrainState(step, params, opt_state, ref_params, moe_state, rng, base)`, `init_train_state`,
  `abstract_state`, `state_shardings`, `with_shardings` (restore targets on any mesh); with
  LoRA (`ModelConfig.lora`) `params` are the adapters and `base` the frozen base.
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
- `RLLoop(...).run() -> RunResult`: prompts -> rollout (any `RolloutClient`; in-process engine
  by default) -> rewards -> advantages -> train -> publish -> checkpoint; sync / one_off /
  async (AReaL staleness), dynamic micro-batching, SIGTERM = save and stop. `LoopConfig`.
- `Checkpointer`: orbax async saves, keep-last-K, fingerprints, fallback from corrupt steps;
  `CheckpointMismatchError` when a checkpoint belongs to another run configuration.
  `CheckpointConfig`.
- `DivergenceGuard` / `DivergenceError`: a non-finite loss or gradient stops the run.
- `RolloutBuffer`: in-flight groups and partial requests, serialised as arrays + JSON.
- `supervised_warmup`, `evaluate`, `PeriodicEval`, `MetricsLogger`, `Progress`, `plot_history`.

`recipe/`, the composition root:
- `RunConfig`: every run setting, one documented field of one section; the flags of
  `python -m experiments.grpo` are generated from it. `RecipeConfig`: its flat façade.
- `build_recipe`, `run_recipe`: what `python -m experiments.grpo` runs, in its own run
  directory (`prepare_run_dir`, `new_run_dir`); `load_model`.
"""
from jaxrl_sys.train.step.batch import Sample, TrainBatch, pack, stack
from jaxrl_sys.train.loop.buffer import RolloutBuffer
from jaxrl_sys.train.loop.checkpoint import Checkpointer, Restored, fingerprint
from jaxrl_sys.train.loop.compat import CheckpointMismatchError
from jaxrl_sys.train.step.config import ALGOS, OptimConfig, TrainConfig, train_config_for_algo
from jaxrl_sys.train.loop.config import MODES, CheckpointConfig, LoopConfig
from jaxrl_sys.train.loop.evaluate import evaluate
from jaxrl_sys.train.loop.guard import DivergenceError, DivergenceGuard
from jaxrl_sys.train.loop.rl_loop import RLLoop, RunResult
from jaxrl_sys.train.loop.metrics_log import MetricsLogger, Progress, plot_history
from jaxrl_sys.train.step.optim import make_optimizer, make_schedule
from jaxrl_sys.train.recipe.presets import load_model
from jaxrl_sys.train.loop.periodic_eval import PeriodicEval
from jaxrl_sys.train.recipe.build import RecipeConfig, RecipeResult, build_recipe, run_recipe
from jaxrl_sys.train.recipe.run_config import RunConfig
from jaxrl_sys.train.recipe.run_dir import new_run_dir, prepare_run_dir
from jaxrl_sys.train.step.programs import TrainPrograms, train_programs
from jaxrl_sys.train.step.state import (TrainState, abstract_state, init_train_state,
                                        state_shardings, with_shardings)
from jaxrl_sys.train.step.update import (Accum, TrainFns, accumulate, apply, fused_step, init_accum,
                                         make_train_fns, token_logprobs, train_step)
from jaxrl_sys.train.loop.supervised import supervised_warmup
from jaxrl_sys.train.precision import PrecisionConfig, rollout_weights

__all__ = [
    "ALGOS", "Accum", "CheckpointConfig", "CheckpointMismatchError", "Checkpointer",
    "DivergenceError", "DivergenceGuard", "LoopConfig", "MODES", "MetricsLogger", "OptimConfig",
    "PeriodicEval", "PrecisionConfig", "Progress", "RLLoop", "RecipeConfig", "RecipeResult",
    "Restored", "RolloutBuffer", "RunConfig", "RunResult", "Sample", "TrainBatch", "TrainConfig",
    "TrainFns", "TrainPrograms", "TrainState", "abstract_state", "accumulate", "apply",
    "build_recipe", "evaluate", "fingerprint", "fused_step", "init_accum", "init_train_state",
    "load_model", "make_optimizer", "make_schedule", "make_train_fns", "new_run_dir", "pack",
    "plot_history", "prepare_run_dir", "rollout_weights", "run_recipe", "stack", "state_shardings",
    "supervised_warmup", "token_logprobs", "train_config_for_algo", "train_programs", "train_step",
    "with_shardings",
]

"""One config tree for a run: `RunConfig`, a frozen dataclass of frozen sections.

    RunConfig
      model        ModelSpec          which policy (preset or Hugging Face directory)
      task         TaskSpec           prompts and reward
      train        AlgoConfig         the algorithm -> `step.config.TrainConfig`
      optim        OptimConfig        the optimizer (step/)
      loop         LoopConfig         the host RL loop (loop/)
      rollout      RolloutSetup       where rollout runs (rollout/setup/spec.py)
      checkpoint   CheckpointConfig   orbax checkpoints (loop/)
      warmup       WarmupConfig       the supervised warm-up before RL
      eval         EvalConfig         held-out evaluation
      distributed  DistributedConfig  devices and processes: the mesh, the multi-process job (dist/)
      output       OutputConfig       where a run writes (not part of its config.json)
      precision    PrecisionConfig    dtypes of masters, compute, rollout (train/precision.py)
      agent        AgentConfig        multi-turn episodes: env, turns, tools (agents/)

Every setting is one field of one section, documented in the section's `Attributes:`
docstring and validated in the section's `__post_init__` (checks that need two sections live
in `RunConfig.__post_init__`). Everything else is derived from the fields:
- the flags of `python -m experiments.grpo` (`--loop.steps=...`, help = the field's
  docstring; see `recipe.cli`), plus the short names users type (`--steps`), `ALIASES`;
- the keys of `--config=FILE` and of a run's `config.json` (the nested tree; flat short names
  and dotted names are read too);
- `RecipeConfig`, the flat Python façade with one field per short name.

Adding a run setting = one field with a docstring:

    @dataclasses.dataclass(frozen=True)
    class LoopConfig:
      '''...
      Attributes:
        ...
        log_every: print / log every N steps.
      '''
      log_every: int = 10

and `--loop.log_every` exists, `--config` and config.json carry it, and the section's consumer
reads `config.loop.log_every`. Give it a short alias in `ALIASES` only when users will type it
often. A setting of a new concern gets its own section class here (precision, ...).
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Mapping

from jaxrl_sys.rollout.setup.spec import RolloutSetup
from jaxrl_sys.agents.config import AgentConfig
from jaxrl_sys.train.multihost.job import DistributedConfig
from jaxrl_sys.train.loop.config import CheckpointConfig, LoopConfig
from jaxrl_sys.train.precision import PrecisionConfig
from jaxrl_sys.train.step.config import (ALGOS, ROUTING_REPLAY, OptimConfig, TrainConfig,
                                        train_config_for_algo)

SCALARS = (str, int, float, bool)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The policy.

  Attributes:
    name: a preset ("tiny", "tiny_moe") or a local Hugging Face directory (config.json,
      *.safetensors, tokenizer.json).
    chat_template: wrap prompts in the Hugging Face tokenizer's chat template when it has one.
  """
  name: str = "tiny"
  chat_template: bool = True


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Prompts and reward.

  Attributes:
    name: arithmetic, countdown, or a prompt data set jsonl:PATH (also parquet:PATH,
      datasets:DIR).
    args: task arguments, e.g. num_digits=2,ops=+- (None: the task's own; data sets:
      prompt_key=..., answer_key=...).
    reward: reward of a data-set task: module:function or path/to/file.py:function, called as
      fn(prompt, completion, **row) -> float (None: exact match on the rows' answer field).
  """
  name: str = "arithmetic"
  args: str | None = None
  reward: str | None = None


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
  """The RL algorithm; `train_config` turns it into the jitted step's `TrainConfig`.

  Attributes:
    algo: one of grpo | mc_grpo | vcpo | dapo | drgrpo (the loss and advantage presets;
      docs/algorithms.md says when each helps).
    kl_coef: KL coefficient to the reference policy (None: the algorithm's preset: 0.04 for
      grpo and mc_grpo, 0 for vcpo, dapo and drgrpo; 0 drops the reference copy). Without KL
      a high learning rate collapses the policy, most surely with --mode=async; keep 0.04
      there.
    remat: recompute the forward pass's activations in the backward pass (less activation
      memory for longer sequences or larger micro-batches, about a third more compute).
    behav_weight_cap: truncated importance sampling: weigh each token by min(pi_train /
      pi_rollout, C), correcting the rollout-train mismatch (the mismatch_* metrics), in every
      mode; None = no weight in sync mode, the uncapped decoupled weight off-policy.
    routing_replay: MoE routing replay, off | R2 | R3 (no effect on a dense policy). R3
      replays the experts the rollout chose for every token in the training forward, so the
      trainer scores the policy that sampled (BIP balancing and capacity limits route a
      training batch differently); R2 replays the policy forward's own routes in the reference
      (KL) forward only; off routes live. docs/moe.md.
    routing_live_mismatch: with routing replay R3, also measure the mismatch of a forward
      with live routes (mismatch_live_* metrics beside mismatch_*; one more forward per
      micro-batch).
  """
  algo: str = "grpo"
  kl_coef: float | None = None
  remat: bool = False
  behav_weight_cap: float | None = None
  routing_replay: str = "R3"
  routing_live_mismatch: bool = False

  def __post_init__(self):
    if self.algo not in ALGOS:
      raise ValueError(f"unknown train.algo {self.algo!r}; choose one of {ALGOS}")
    if self.routing_replay not in ROUTING_REPLAY:
      raise ValueError(f"train.routing_replay={self.routing_replay!r} is not one of "
                       f"{ROUTING_REPLAY} (R3: replay the rollout's MoE routes in training; "
                       "off: route live)")
    if self.behav_weight_cap is not None and not self.behav_weight_cap > 0:
      raise ValueError(f"train.behav_weight_cap={self.behav_weight_cap} must be > 0 (unset = no "
                       "cap)")

  def train_config(self, optim: OptimConfig, loop: LoopConfig) -> TrainConfig:
    """The step's config: the algorithm's presets, the decoupled objective off-policy, and
    every other field of this section passed to `TrainConfig` by name."""
    extra = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("algo", "kl_coef", "behav_weight_cap")}
    train = train_config_for_algo(self.algo, decoupled=loop.mode != "sync", kl_coef=self.kl_coef,
                                  optim=optim, **extra)
    if self.behav_weight_cap is None:
      return train
    # Truncated importance sampling (clamp mode), sync included (losses.mismatch).
    return dataclasses.replace(train, loss=dataclasses.replace(
        train.loss, decoupled=True, behav_weight_cap=self.behav_weight_cap,
        behav_weight_cap_mode="clamp"))


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
  """Supervised warm-up on the task's answers before RL (fresh runs only).

  Attributes:
    steps: warm-up steps (None: 60 for the tiny presets, 0 for a Hugging Face model).
    learning_rate: warm-up learning rate.
    batch_size: warm-up batch size.
  """
  steps: int | None = None
  learning_rate: float = 3e-3
  batch_size: int = 32

  def __post_init__(self):
    if self.steps is not None and self.steps < 0:
      raise ValueError(f"warmup.steps={self.steps} must be >= 0 (0 = no supervised warm-up)")
    if self.batch_size < 1:
      raise ValueError(f"warmup.batch_size={self.batch_size} must be >= 1")
    if not self.learning_rate > 0:
      raise ValueError(f"warmup.learning_rate={self.learning_rate} must be > 0")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out evaluation.

  Attributes:
    every: evaluate on held-out prompts every N steps and at the end (0 = off).
    prompts: held-out prompts (data sets: the last rows, removed from training when
      `every` > 0).
  """
  every: int = 0
  prompts: int = 32

  def __post_init__(self):
    if self.every < 0:
      raise ValueError(f"eval.every={self.every} must be >= 0 (0 = off)")
    if self.prompts < 1:
      raise ValueError(f"eval.prompts={self.prompts} must be >= 1")


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  """Where a run writes; not part of what it computes (left out of its config.json).

  Attributes:
    out_dir: run directory (None: a new runs/<algo>-<task>-<time>).
    overwrite: replace the outputs of an earlier run in `out_dir` (and a non-empty `export_hf`
      directory); not with --resume, nor while that run is alive (its lock).
    export_hf: write the trained policy as a Hugging Face directory (safetensors, config.json,
      tokenizer files).
    progress: show the progress bar on stderr.
  """
  out_dir: str | None = None
  overwrite: bool = False
  export_hf: str | None = None
  progress: bool = True


# Short flag names (what users type today) -> the field they set.
ALIASES = {
    "mesh": "distributed.mesh", "algo": "train.algo", "kl_coef": "train.kl_coef",
    "model": "model.name", "chat_template": "model.chat_template",
    "task": "task.name", "task_args": "task.args", "reward": "task.reward",
    "group_size": "loop.group_size", "prompts_per_step": "loop.prompts_per_step",
    "steps": "loop.steps", "mode": "loop.mode", "max_staleness": "loop.max_staleness",
    "micro_batch_groups": "loop.micro_batch_groups",
    "dynamic_micro_batching": "loop.dynamic_micro_batching",
    "max_new_tokens": "loop.max_new_tokens", "max_prompt_len": "loop.max_prompt_len",
    "temperature": "loop.temperature", "oversample": "loop.oversample", "seed": "loop.seed",
    "local_workers": "loop.local_workers",
    "learning_rate": "optim.learning_rate", "lr_warmup_steps": "optim.warmup_steps",
    "skip_nonfinite": "optim.skip_nonfinite",
    "sft_steps": "warmup.steps", "sft_learning_rate": "warmup.learning_rate",
    "sft_batch_size": "warmup.batch_size",
    "eval_every": "eval.every", "eval_prompts": "eval.prompts",
    "checkpoint_dir": "checkpoint.directory", "save_every": "checkpoint.save_every",
    "keep_checkpoints": "checkpoint.keep",
    "coordinator_address": "distributed.coordinator_address",
    "num_processes": "distributed.num_processes", "process_id": "distributed.process_id",
    "local_device_ids": "distributed.local_device_ids",
    "distributed_timeout": "distributed.timeout",
    "out_dir": "output.out_dir", "overwrite": "output.overwrite",
    "export_hf": "output.export_hf", "progress": "output.progress",
    "behav_weight_cap": "train.behav_weight_cap",
    "env": "agent.env", "max_turns": "agent.max_turns", "tool_timeout": "agent.tool_timeout",
    "tool_workers": "agent.tool_workers",
    **{name: f"precision.{name}" for name in ("param_dtype", "compute_dtype", "rollout_dtype",
                                              "export_dtype")},
    **{name: f"rollout.{name}" for name in (
        "rollout", "num_workers", "ray_address", "weight_store", "preempt_trace",
        "trace_time_scale", "chaos_kill_every", "chaos_restart_after", "worker_token_delay",
        "worker_cpus", "worker_gpus", "offload", "t_seed_init")},
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Every setting of a run, one section per concern (see the module docstring).

  `config.loop.steps` is the setting. The short names (`ALIASES`: `steps`, `mesh`, ...) are the
  command line's and the flat `RecipeConfig` façade's: `get(name)` and `replace(**changes)`
  take short or dotted names, attribute access takes sections only.
  """
  model: ModelSpec = ModelSpec()
  task: TaskSpec = TaskSpec()
  train: AlgoConfig = AlgoConfig()
  optim: OptimConfig = OptimConfig(learning_rate=1e-3, warmup_steps=5)
  loop: LoopConfig = LoopConfig(steps=100, prompts_per_step=64, group_size=4,
                                micro_batch_groups=16, max_new_tokens=None, max_prompt_len=None)
  rollout: RolloutSetup = RolloutSetup()
  checkpoint: CheckpointConfig = CheckpointConfig(save_every=10)
  warmup: WarmupConfig = WarmupConfig()
  eval: EvalConfig = EvalConfig()
  distributed: DistributedConfig = DistributedConfig()
  output: OutputConfig = OutputConfig()
  precision: PrecisionConfig = PrecisionConfig()
  agent: AgentConfig = AgentConfig()

  def __post_init__(self):
    if self.loop.group_size < 2:
      raise ValueError(
          f"loop.group_size={self.loop.group_size} with train.algo={self.train.algo}: GRPO-family "
          "advantages compare samples of the same prompt, so each group needs at least 2 "
          "samples")

  def get(self, path: str) -> Any:
    """The value at "section.field" or a short name."""
    section, field = resolve(path).split(".")
    return getattr(getattr(self, section), field)

  def replace(self, **changes) -> RunConfig:
    """A copy with `changes` ({"steps": 3} or {"loop.steps": 3}) applied, validated."""
    return from_settings(changes, base=self)

  def tree(self, settings_only: bool = True) -> dict[str, dict[str, Any]]:
    """{section: {field: value}} (settings only: the flag-facing scalar fields)."""
    return {s: {f: getattr(getattr(self, s), f) for f in (setting_names(t) if settings_only
                else [x.name for x in dataclasses.fields(t)])}
            for s, t in sections().items()}


@functools.cache
def sections() -> dict[str, type]:
  """{section name: its dataclass}."""
  hints = typing.get_type_hints(RunConfig)
  return {f.name: hints[f.name] for f in dataclasses.fields(RunConfig)}


@functools.cache
def field_types(cls: type) -> dict[str, type]:
  """{field: its scalar type} of a section (Optional[X] -> X), settings only."""
  out = {}
  for name, hint in typing.get_type_hints(cls).items():
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if len(args) == 1 and args[0] in SCALARS:
      out[name] = args[0]
  return out


def setting_names(cls: type) -> list[str]:
  """The fields of a section that are settings (scalars: flags, config-file keys); derived
  fields such as `CheckpointConfig.identity` are not."""
  types = field_types(cls)
  return [f.name for f in dataclasses.fields(cls) if f.name in types]


def setting_paths() -> list[str]:
  """Every "section.field" setting of `RunConfig`."""
  return [f"{s}.{f}" for s, cls in sections().items() for f in setting_names(cls)]


def resolve(name: str) -> str:
  """"steps" or "loop.steps" -> "loop.steps" (KeyError for an unknown name)."""
  path = ALIASES.get(name, name)
  if path not in setting_paths():
    raise KeyError(name)
  return path


def from_settings(values: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
  """A `RunConfig` from {short or dotted name: value} on top of `base` (default: defaults).

  Raises:
    ValueError: an unknown name, or a value a section's `__post_init__` rejects.
  """
  base = base or RunConfig()
  per_section: dict[str, dict[str, Any]] = {}
  for name, value in values.items():
    try:
      section, field = resolve(name).split(".")
    except KeyError:
      raise ValueError(f"unknown setting {name!r}") from None
    per_section.setdefault(section, {})[field] = value
  return dataclasses.replace(base, **{
      s: dataclasses.replace(getattr(base, s), **changes) for s, changes in per_section.items()})


def _recipe_config_class() -> type:
  run = RunConfig()
  fields = []
  for short, path in ALIASES.items():
    section, field = path.split(".")
    hint = typing.get_type_hints(sections()[section])[field]
    fields.append((short, hint, dataclasses.field(default=run.get(path))))

  def run_config(self) -> RunConfig:
    """The validated `RunConfig` of these settings."""
    return from_settings({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

  def post_init(self):
    run_config(self)  # validates

  cls = dataclasses.make_dataclass("RecipeConfig", fields, frozen=True, namespace={
      "__post_init__": post_init, "run_config": run_config})
  cls.__module__ = __name__
  cls.__doc__ = ("The flat Python façade of `RunConfig`: one field per short flag name "
                 "(`ALIASES`), the same defaults; validated on construction; `run_config()` "
                 "gives the tree.")
  return cls

RecipeConfig = _recipe_config_class()

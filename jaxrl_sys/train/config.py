"""Frozen configuration of the trainer, the RL loop and checkpoints.

`TrainConfig` is static for the jitted step (hashable; part of the compile key); `LoopConfig`
drives the host loop (modes, batch sizes, staleness); `CheckpointConfig` the orbax manager.
Every config validates itself in `__post_init__` with messages that name the bad value.
"""
from __future__ import annotations

import dataclasses

from jaxrl_sys.losses.config import AdvantageConfig, PolicyLossConfig, preset

ALGOS = ("grpo", "mc_grpo", "vcpo", "dapo", "drgrpo")
MODES = ("sync", "one_off", "async")
SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with global-norm clipping and a warm-up + decay schedule.

  Attributes:
    learning_rate: peak learning rate.
    schedule: "constant", "cosine" or "linear" decay after warm-up, to
      `learning_rate * end_lr_ratio` at `decay_steps`.
    warmup_steps: linear warm-up from 0 (0 = none).
    decay_steps: length of the whole schedule (warm-up included); 0 = constant after warm-up.
    end_lr_ratio: final learning rate as a fraction of the peak.
    b1, b2, eps: Adam moments.
    weight_decay: decoupled weight decay (AdamW).
    grad_clip: global-norm clip; 0 disables it.
    skip_nonfinite: drop an update whose gradient is not finite (`optax.apply_if_finite`)
      instead of applying it; the loop's divergence guard then records the skip and stops
      only after several in a row (default False: the guard stops at the first one).
  """
  learning_rate: float = 1e-3
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_steps: int = 0
  end_lr_ratio: float = 0.1
  b1: float = 0.9
  b2: float = 0.99
  eps: float = 1e-8
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  skip_nonfinite: bool = False

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule={self.schedule!r} is not one of {SCHEDULES}")
    if self.warmup_steps < 0 or self.decay_steps < 0:
      raise ValueError("warmup_steps and decay_steps must be >= 0")
    if self.grad_clip < 0 or self.weight_decay < 0:
      raise ValueError("grad_clip and weight_decay must be >= 0")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """What the jitted train step needs (all static).

  Attributes:
    algo: one of ALGOS; selects the advantage / loss presets (see `train_config_for_algo`).
    advantage: group-advantage config (host side, before packing).
    loss: policy-loss config; `loss.decoupled` selects AReaL's decoupled PPO (behaviour =
      rollout logprobs, proximal = the parameters before this update).
    optim: optimizer config.
    temperature: sampling temperature; logprobs are recomputed at it.
    ess_lr_scaling: VCPO: scale the learning rate by the effective sample size.
    ess_rule, base_ess_ratio: see `losses.ess_lr_scale`.
    logprob_impl: "auto" | "pallas" | "xla" | "xla_tokens" for `kernels.fused_logprobs` ("auto":
      `jaxrl_sys.backend`, token chunks on GPU, vocabulary chunks elsewhere).
    logprob_chunk: vocabulary chunk of the fused op's XLA path.
    remat: rematerialise the forward pass in the backward pass (saves activation memory).
    unroll_layers_max: unroll the training forward's layer loop for models with at most this
      many layers (XLA:CPU runs unrolled layers ~15% faster: no while loop, no stacked
      residuals); deeper models keep the scan (one compiled layer). 0 = always scan.
  """
  algo: str = "grpo"
  advantage: AdvantageConfig = AdvantageConfig()
  loss: PolicyLossConfig = PolicyLossConfig()
  optim: OptimConfig = OptimConfig()
  temperature: float = 1.0
  ess_lr_scaling: bool = False
  ess_rule: str = "sqrt"
  base_ess_ratio: float = 1.0
  logprob_impl: str = "auto"
  logprob_chunk: int = 1024
  remat: bool = False
  unroll_layers_max: int = 8

  def __post_init__(self):
    if self.algo not in ALGOS:
      raise ValueError(f"unknown algo {self.algo!r}; choose one of {ALGOS}")
    if not self.temperature > 0:
      raise ValueError(f"training needs a temperature > 0 (logprobs at the sampling "
                       f"temperature), got {self.temperature}")
    if self.loss.kl_where != "loss":
      raise ValueError("the trainer supports kl_where='loss' only (a KL reward penalty would "
                       "need reference log-probs on the host before the advantages)")

  @property
  def uses_reference(self) -> bool:
    """True when a frozen reference copy is needed (KL coefficient > 0)."""
    return self.loss.kl_coef > 0


def train_config_for_algo(algo: str, *, decoupled: bool = False, kl_coef: float | None = None,
                          **overrides) -> TrainConfig:
  """A `TrainConfig` with the loss presets of `algo`.

  Args:
    algo: "grpo", "mc_grpo", "vcpo", "dapo" or "drgrpo".
    decoupled: use the decoupled PPO objective (asynchronous / off-policy modes).
    kl_coef: overrides the preset's KL coefficient (0 drops the reference copy).
    **overrides: other `TrainConfig` fields.
  """
  if algo not in ALGOS:
    raise ValueError(f"unknown algo {algo!r}; choose one of {ALGOS}")
  adv, loss = preset(algo)
  changes = {"decoupled": decoupled}
  if kl_coef is not None:
    changes["kl_coef"] = kl_coef
  loss = dataclasses.replace(loss, **changes)
  overrides.setdefault("ess_lr_scaling", algo == "vcpo")
  return TrainConfig(algo=algo, advantage=adv, loss=loss, **overrides)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Orbax checkpointing.

  Attributes:
    directory: where step directories go; None disables checkpoints.
    save_every: save every N train steps (0 = only on preemption / at the end).
    keep: keep the last K checkpoints.
    async_save: let orbax write in the background.
    checksum: store a fingerprint of the state and verify it on restore.
    identity: JSON-serialisable fields that define the run (model, task, algorithm, ...);
      stored with every checkpoint, and a restore whose identity differs raises
      `CheckpointMismatchError` naming the fields (None: not recorded or compared).
  """
  directory: str | None = None
  save_every: int = 0
  keep: int = 3
  async_save: bool = True
  checksum: bool = True
  identity: dict | None = None

  def __post_init__(self):
    if self.save_every < 0:
      raise ValueError(f"save_every must be >= 0, got {self.save_every}")
    if self.keep < 1:
      raise ValueError(f"keep must be >= 1 (keep-last-K), got {self.keep}")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """The host RL loop.

  Attributes:
    steps: number of train steps (the run stops when `state.step` reaches it).
    prompts_per_step: B, groups per train step.
    group_size: G, samples per prompt (MC-GRPO samples G + 1 and excludes the pivot).
    mode: "sync" (on-policy: every token of step k from version k), "one_off" (step k trains
      on samples generated entirely by version k - 1) or "async" (AReaL: admit new groups
      while `accepted < (max_staleness + version + 1) * B`; in-flight samples continue on new
      weights, so one sample can span versions).
    max_staleness: eta of the async mode.
    micro_batch_groups: m_b, groups per micro-batch (gradient accumulation unit).
    dynamic_micro_batching: start a micro-batch as soon as m_b groups are complete instead of
      waiting for the whole step's B groups.
    max_new_tokens: response budget per sample.
    max_prompt_len: prompt length bucket (prompts are padded to it; longer ones are an error).
    temperature: sampling temperature (logprobs of the full distribution at it).
    oversample: APRIL over-provisioning factor in sync / one_off modes (>= 1): submit
      ceil(B * oversample) groups, keep the first B complete, carry the rest (partial) over.
    seed: run seed (request keys, parameter init).
    log_every: print / log every N steps.
    poll_timeout: seconds a poll may wait for completions.
    stall_timeout: seconds without any completion, while requests are pending, after which
      the run stops with an error describing the rollout state (e.g. every worker lost).
    local_workers: engines of the embedded in-process rollout, splitting its decode slots and
      generating side by side on threads of their own (`rollout.ThreadWorker`); 0 = auto: two
      on a CPU host with at least two cores when each keeps 32 slots or more, else one.
  """
  steps: int = 20
  prompts_per_step: int = 8
  group_size: int = 8
  mode: str = "sync"
  max_staleness: int = 0
  micro_batch_groups: int = 4
  dynamic_micro_batching: bool = True
  max_new_tokens: int = 8
  max_prompt_len: int = 16
  temperature: float = 1.0
  oversample: float = 1.0
  seed: int = 0
  log_every: int = 10
  poll_timeout: float = 60.0
  stall_timeout: float = 600.0
  local_workers: int = 0

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"unknown mode {self.mode!r}; choose one of {MODES}")
    if self.steps < 0 or self.prompts_per_step < 1 or self.micro_batch_groups < 1:
      raise ValueError("steps >= 0, prompts_per_step >= 1 and micro_batch_groups >= 1 needed")
    if self.group_size < 2:
      raise ValueError(
          f"group_size={self.group_size}: GRPO-family advantages are relative to the other "
          "samples of the same prompt, so each group needs at least 2 samples")
    if self.max_staleness < 0:
      raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
    if self.mode != "async" and self.max_staleness:
      raise ValueError(f"max_staleness={self.max_staleness} needs mode='async'")
    if self.max_new_tokens < 1 or self.max_prompt_len < 1:
      raise ValueError("max_new_tokens and max_prompt_len must be >= 1")
    if not self.temperature > 0:
      raise ValueError(f"temperature must be > 0 for RL sampling, got {self.temperature}")
    if self.oversample < 1:
      raise ValueError(f"oversample must be >= 1, got {self.oversample}")
    if not (self.poll_timeout > 0 and self.stall_timeout > 0):
      raise ValueError("poll_timeout and stall_timeout must be > 0")
    if self.local_workers < 0:
      raise ValueError(f"local_workers must be >= 0 (0 = auto), got {self.local_workers}")

  @property
  def staleness(self) -> int:
    """eta of the admission rule: 0 (sync), 1 (one_off) or max_staleness (async)."""
    return {"sync": 0, "one_off": 1}.get(self.mode, self.max_staleness)

  @property
  def seq_len(self) -> int:
    """Length of the packed training sequences (prompt bucket + response budget)."""
    return self.max_prompt_len + self.max_new_tokens

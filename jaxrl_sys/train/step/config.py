"""Frozen configuration of the train step: `TrainConfig` (static for the jitted step: hashable,
part of the compile key) and `OptimConfig`. Each validates itself in `__post_init__` with
messages that name the bad value.
"""
from __future__ import annotations

import dataclasses

from jaxrl_sys.losses.config import AdvantageConfig, PolicyLossConfig, preset

ALGOS = ("grpo", "mc_grpo", "vcpo", "dapo", "drgrpo")
ROUTING_REPLAY = ("off", "R2", "R3")
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
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    eps: Adam's denominator epsilon.
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
      raise ValueError(f"optim.learning_rate={self.learning_rate} must be > 0")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"optim.schedule={self.schedule!r} is not one of {SCHEDULES}")
    if self.warmup_steps < 0 or self.decay_steps < 0:
      raise ValueError("optim.warmup_steps and optim.decay_steps must be >= 0")
    if self.grad_clip < 0 or self.weight_decay < 0:
      raise ValueError("optim.grad_clip and optim.weight_decay must be >= 0")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """What the jitted train step needs (all static); the sampling temperature its log-probs are
  computed at is the rollout's (`models.SamplingConfig`, passed beside it).

  Attributes:
    algo: one of ALGOS; selects the advantage / loss presets (see `train_config_for_algo`).
    advantage: group-advantage config (host side, before packing).
    loss: policy-loss config; `loss.decoupled` selects AReaL's decoupled PPO (behaviour =
      rollout logprobs, proximal = the parameters before this update).
    optim: optimizer config.
    ess_lr_scaling: VCPO: scale the learning rate by the effective sample size.
    ess_rule, base_ess_ratio: see `losses.ess_lr_scale`.
    logprob_impl: "auto" | "pallas" | "xla" | "xla_tokens" for `kernels.fused_logprobs` ("auto":
      `jaxrl_sys.backend`, token chunks on GPU, vocabulary chunks elsewhere).
    logprob_chunk: vocabulary chunk of the fused op's XLA path.
    remat: rematerialise the forward pass in the backward pass (saves activation memory).
    unroll_layers_max: unroll the training forward's layer loop for models with at most this
      many layers (XLA:CPU runs unrolled layers ~15% faster: no while loop, no stacked
      residuals); deeper models keep the scan (one compiled layer). 0 = always scan.
    routing_replay: MoE routing replay (no effect on a dense policy): "R3" replays the experts
      the rollout engine chose for every token (recorded with the samples) in the policy and
      reference forwards, so the trainer's log-probs are those of the policy that sampled,
      whatever BIP balancing or a capacity limit would choose for the training batch; "R2"
      routes the policy forward live and replays its routes in the reference forward; "off"
      routes every forward live. See docs/moe.md.
    routing_live_mismatch: under routing replay R3, also run each micro-batch's policy forward
      with live routes (no gradient) and log its mismatch to the rollout log-probs as
      mismatch_live_mean / _max / _out_frac beside the replayed mismatch_*: what replay
      removes (one more forward per micro-batch).
  """
  algo: str = "grpo"
  advantage: AdvantageConfig = AdvantageConfig()
  loss: PolicyLossConfig = PolicyLossConfig()
  optim: OptimConfig = OptimConfig()
  ess_lr_scaling: bool = False
  ess_rule: str = "sqrt"
  base_ess_ratio: float = 1.0
  logprob_impl: str = "auto"
  logprob_chunk: int = 1024
  remat: bool = False
  unroll_layers_max: int = 8
  routing_replay: str = "R3"
  routing_live_mismatch: bool = False

  def __post_init__(self):
    if self.algo not in ALGOS:
      raise ValueError(f"unknown algo {self.algo!r}; choose one of {ALGOS}")
    if self.routing_replay not in ROUTING_REPLAY:
      raise ValueError(f"train.routing_replay={self.routing_replay!r} is not one of "
                       f"{ROUTING_REPLAY}")
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

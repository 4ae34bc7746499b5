"""Configuration of the RL losses: advantage and policy-loss configs, algorithm presets.

Both configs are frozen, hashable dataclasses registered as *static* pytrees, so they can be
passed to `jax.jit`-ed functions as ordinary arguments (they add no leaves and become part of the
cache key) or closed over.

Decisions on the ambiguities of spec/algorithms.md section 9 (also summarised in docs/losses.md):

* GRPO std: Bessel-corrected (`ddof=1`) with `eps=1e-6` added to the std (Tunix / verl); groups
  must have at least 2 members (a group of one carries no signal; we refuse it like Tunix).
* Zero-variance groups (all rewards equal, e.g. all-correct or all-wrong) get an advantage of
  exactly 0 (forced, not left to floating-point cancellation) and are counted in the metrics.
* "grpo" aggregation divides by the number of *non-empty* rows (rows with at least one valid
  token), as Tunix does; this makes an excluded MC-GRPO pivot (mask 0) behave exactly like the
  reference trainer, which deletes the pivot row. Dr. GRPO divides by `non-empty rows * C` with
  `C = drgrpo_constant_length` (set it to the max completion length) or, if None, the padded
  length `T` of the array. Normalisation is global across gradient-accumulation micro-batches
  (every loss returns its numerator and denominator; see aggregation.py).
* KL: k3 by default (DeepSeekMath, TRL), aggregated with the same mode as the policy term and
  added to the per-token loss before the single division. As a reward penalty it is detached.
* MC-GRPO: pivot = lowest index whose reward equals the (lower) median; MAD over all G+1
  members; `mad_guard=True` divides by 1 instead of `0 + eps` when the MAD of a group is 0 (the
  reference's `MAD + 1e-3` gives +-1000x advantages for binary rewards); `mad_guard=False`
  reproduces the reference bit for bit. The GSM-only non-zero rescale is not applied. Token-mean
  normalisers exclude the pivot tokens (pass `denominator=` to count them like the reference).
* VCPO: ESS from unclipped sequence weights in log space (no overflow, no 1e-8 term needed);
  OPOB uses the paper's w^2 (the IS weight enters once) and population std with a 1e-8 threshold.
"""
import dataclasses
from typing import Literal

import jax

Baseline = Literal["mean", "median"]
Scale = Literal["std", "none", "mad"]
KLEstimator = Literal["k1", "k2", "k3"]
KLWhere = Literal["loss", "reward"]
Aggregation = Literal[
    "seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"]
CapMode = Literal["clamp", "mask"]
OldPolicy = Literal["proximal", "behaviour"]

BASELINES = ("mean", "median")
SCALES = ("std", "none", "mad")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_WHERE = ("loss", "reward")
AGGREGATIONS = (
    "seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum")
CAP_MODES = ("clamp", "mask")
OLD_POLICIES = ("proximal", "behaviour")


def _one_of(name, value, allowed):
  if value not in allowed:
    raise ValueError(f"{name}={value!r} is not one of {allowed}")


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """How group advantages are computed from outcome rewards.

  Attributes:
    baseline: "mean" (GRPO) or "median" (MC-GRPO; the pivot sample is excluded via a mask).
    scale: "std" (group std, GRPO), "none" (Dr. GRPO) or "mad" (median absolute deviation from
      the baseline, MC-GRPO).
    eps: added to the scale before dividing (1e-6 for std; MC-GRPO's reference uses 1e-3).
    ddof: delta degrees of freedom of the std (1 = Bessel-corrected, as TRL/Tunix/verl).
    mad_guard: with scale="mad", a group whose MAD is exactly 0 is divided by 1 instead of by
      `eps` (avoids +-1/eps advantages for binary rewards). False reproduces the reference.
  """
  baseline: Baseline = "mean"
  scale: Scale = "std"
  eps: float = 1e-6
  ddof: int = 1
  mad_guard: bool = True

  def __post_init__(self):
    _one_of("baseline", self.baseline, BASELINES)
    _one_of("scale", self.scale, SCALES)
    if not self.eps >= 0:
      raise ValueError(f"eps must be >= 0, got {self.eps}")
    if self.ddof not in (0, 1):
      raise ValueError(f"ddof must be 0 or 1, got {self.ddof}")


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Per-token policy loss (PPO-clip family) and its aggregation.

  Attributes:
    clip_eps_low: lower clip range, ratio >= 1 - clip_eps_low (0.2).
    clip_eps_high: upper clip range, ratio <= 1 + clip_eps_high (0.2; DAPO clip-higher 0.28).
    dual_clip_c: if set (> 1), for A < 0 the per-token loss is capped at -c * A (dual clip).
    kl_coef: beta of the KL-to-reference term; 0 disables it.
    kl_estimator: "k1", "k2" or "k3" (see kl.py).
    kl_where: "loss" (differentiable term added per token) or "reward" (the trainer subtracts
      `kl_penalized_rewards` from the rewards before the advantages; the loss only reports KL).
    aggregation: "seq_mean_token_mean" (GRPO), "token_mean" (DAPO),
      "seq_mean_token_sum_norm" (Dr. GRPO, constant normaliser) or "seq_mean_token_sum".
    drgrpo_constant_length: C of Dr. GRPO; None uses the padded length T of the arrays.
    entropy_coef: entropy bonus coefficient (per-token loss -= coef * entropy).
    decoupled: decoupled PPO (AReaL): `old_logprobs` are the proximal policy's, and a detached
      behaviour weight pi_prox / pi_behav (from `behav_logprobs`) multiplies each token.
    behav_weight_cap: cap on the behaviour weight (None: uncapped).
    behav_weight_cap_mode: "clamp" truncates the weight at the cap; "mask" zeroes tokens whose
      weight exceeds it (they stay in the denominator, as in AReaL).
    logratio_clamp: log-ratios are clamped to [-c, c] before exp (Tunix/verl use 20); None = off.
    old_policy: the policy the train step takes the ratio (and its clip) against. "proximal":
      the parameters before this update; the step makes one update per batch, so the ratio is
      exactly 1 and no clip binds (only the decoupled behaviour weight sees staleness).
      "behaviour": the rollout engine's log-probs (coupled PPO, verl's rollout-log-probs
      mode): stale samples move the ratio off 1 and the clip binds on them, as in PPO's
      several updates per batch. Excludes `decoupled`.
  """
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  dual_clip_c: float | None = None
  kl_coef: float = 0.0
  kl_estimator: KLEstimator = "k3"
  kl_where: KLWhere = "loss"
  aggregation: Aggregation = "seq_mean_token_mean"
  drgrpo_constant_length: int | None = None
  entropy_coef: float = 0.0
  decoupled: bool = False
  behav_weight_cap: float | None = None
  behav_weight_cap_mode: CapMode = "clamp"
  logratio_clamp: float | None = 20.0
  old_policy: OldPolicy = "proximal"

  def __post_init__(self):
    if not 0 <= self.clip_eps_low <= 1:
      raise ValueError(f"clip_eps_low must be in [0, 1], got {self.clip_eps_low}")
    if not self.clip_eps_high >= 0:
      raise ValueError(f"clip_eps_high must be >= 0, got {self.clip_eps_high}")
    if self.dual_clip_c is not None and not self.dual_clip_c > 1:
      raise ValueError(f"dual_clip_c must be > 1, got {self.dual_clip_c}")
    if not self.kl_coef >= 0:
      raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
    _one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
    _one_of("kl_where", self.kl_where, KL_WHERE)
    _one_of("aggregation", self.aggregation, AGGREGATIONS)
    if self.drgrpo_constant_length is not None and self.drgrpo_constant_length < 1:
      raise ValueError(
          f"drgrpo_constant_length must be >= 1, got {self.drgrpo_constant_length}")
    if self.behav_weight_cap is not None and not self.behav_weight_cap > 0:
      raise ValueError(f"behav_weight_cap must be > 0, got {self.behav_weight_cap}")
    _one_of("behav_weight_cap_mode", self.behav_weight_cap_mode, CAP_MODES)
    _one_of("old_policy", self.old_policy, OLD_POLICIES)
    if self.old_policy == "behaviour" and self.decoupled:
      raise ValueError("old_policy='behaviour' takes the ratio against the behaviour policy "
                       "already: set decoupled=False (and no behav_weight_cap) with it")
    if self.logratio_clamp is not None and not self.logratio_clamp > 0:
      raise ValueError(f"logratio_clamp must be > 0, got {self.logratio_clamp}")


# The presets follow the published recipes, and three of them (dapo, drgrpo, vcpo) have no KL
# term: measured on the tiny preset (benchmarks/algorithms.py, docs/algorithms.md), without a
# KL anchor a high learning rate (5e-3) collapses every algorithm, the vcpo preset included,
# most surely off-policy (async, max_staleness 8): the reward falls to ~0 within 10-20 steps.
# With such settings keep kl_coef 0.04 (VCPO then beats GRPO at staleness >= 8) or lower the
# learning rate; the loop reports a collapse once (train/loop/collapse.py).
_PRESETS = {
    # DeepSeekMath GRPO: group mean/std, symmetric clip 0.2, k3 KL beta 0.04 in the loss,
    # sequence-mean-token-mean.
    "grpo": (AdvantageConfig(),
             PolicyLossConfig(kl_coef=0.04, kl_estimator="k3")),
    # DAPO: clip-higher 0.2 / 0.28, token-mean, no KL.
    "dapo": (AdvantageConfig(),
             PolicyLossConfig(clip_eps_high=0.28, aggregation="token_mean")),
    # Dr. GRPO: no std division, constant normaliser (set drgrpo_constant_length to the max
    # completion length; None falls back to the padded length), no KL.
    "drgrpo": (AdvantageConfig(scale="none"),
               PolicyLossConfig(aggregation="seq_mean_token_sum_norm")),
    # MC-GRPO: median baseline over G+1 samples, MAD scale with eps 1e-3 (guarded when MAD=0),
    # TRL "grpo" aggregation and k3 KL beta 0.04 as in the published recipes.
    "mc_grpo": (AdvantageConfig(baseline="median", scale="mad", eps=1e-3),
                PolicyLossConfig(kl_coef=0.04, kl_estimator="k3")),
    # VCPO published MATH run: GRPO advantages, clipping disabled (low 1.0, high 1e9), no KL,
    # no entropy, sequence-mean-token-mean. The ESS learning-rate scale (`scale_by_ess`, sqrt
    # rule, base ratio 1.0) and the OPOB baseline (`opob_advantages`) are applied by the trainer.
    "vcpo": (AdvantageConfig(),
             PolicyLossConfig(clip_eps_low=1.0, clip_eps_high=1e9)),
}

PRESETS = tuple(_PRESETS)


def preset(name: str) -> tuple[AdvantageConfig, PolicyLossConfig]:
  """Default (AdvantageConfig, PolicyLossConfig) of an algorithm.

  Args:
    name: one of "grpo", "dapo", "drgrpo", "mc_grpo", "vcpo".

  Returns:
    The two frozen configs; derive variants with `dataclasses.replace`.

  "dapo", "drgrpo" and "vcpo" have no KL term (their papers' settings): at high learning
  rates, most surely off-policy, they collapse (docs/algorithms.md); add one with
  `dataclasses.replace(loss, kl_coef=0.04)`.
  """
  try:
    return _PRESETS[name]
  except KeyError:
    raise ValueError(f"unknown preset {name!r}; choose one of {PRESETS}") from None

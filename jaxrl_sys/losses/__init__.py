"""RL losses for LLM post-training: pure, jit/vmap/grad-able functions with no framework state.

* Advantages: `group_advantages` (GRPO mean/std, Dr. GRPO mean/none, MC-GRPO median/MAD with a
  pivot mask), `mc_grpo_advantages` -> `AdvantageOutput(advantages, mask, aux)`.
* Policy losses on `[batch, seq]` arrays with a response mask: `policy_loss` (one entry point,
  configured by `PolicyLossConfig`) and the named wrappers `grpo_loss`, `dapo_loss`,
  `drgrpo_loss`, `decoupled_ppo_loss` -> `LossOutput(loss, numerator, denominator, aux)`.
  Sum numerators and denominators over gradient-accumulation micro-batches and divide once,
  or pass the whole batch's `loss_denominator(...)` as `denominator=`.
* KL to a reference: `kl_estimate` (k1/k2/k3), `kl_penalized_rewards` (as a reward penalty).
* Rollout-train mismatch: `mismatch_stats` (mean / max |logp_train - logp_rollout|, fraction of
  tokens whose ratio leaves [0.5, 2]); the remedy is `behav_weight_cap`.
* VCPO: `sequence_log_weights`, `effective_sample_size` (log space), `ess_lr_scale`, the optax
  transformation `scale_by_ess`, the OPOB baseline `opob_baseline` / `opob_advantages` and
  `per_sequence_grad_sq_norms` (per-trajectory gradient norms via vmap(grad)).
* Configs and presets: `AdvantageConfig`, `PolicyLossConfig`, `preset(name)` for "grpo",
  "dapo", "drgrpo", "mc_grpo", "vcpo" (decisions on the spec's ambiguities: config.py).
* Checks (`losses.checks`): dtypes and static denominators raise at trace time; data checks
  (NaN/inf, mask values other than 0/1, log-probabilities above 0) raise `LossInputError` /
  `NonFiniteError` on concrete (eager) inputs and, under `jit`, in checked mode: `checked(fn)`
  (checkify), or `enable_checks` in a trainer's own checkified step. `validate_rewards` is the
  host-side reward validator.

Usage: docs/losses.md.
"""
from jaxrl_sys.losses.advantages import AdvantageOutput, group_advantages, mc_grpo_advantages
from jaxrl_sys.losses.aggregation import LossOutput, aggregate, loss_denominator
from jaxrl_sys.losses.checks import (LossInputError, NonFiniteError, check_finite, checked,
                                     enable_checks, validate_rewards)
from jaxrl_sys.losses.config import PRESETS, AdvantageConfig, PolicyLossConfig, preset
from jaxrl_sys.losses.ess import (ScaleByESSState, effective_sample_size, ess_lr_scale,
                                  scale_by_ess, sequence_log_weights)
from jaxrl_sys.losses.kl import kl_estimate, kl_penalized_rewards
from jaxrl_sys.losses.mismatch import mismatch_stats
from jaxrl_sys.losses.opob import opob_advantages, opob_baseline, per_sequence_grad_sq_norms
from jaxrl_sys.losses.policy import (dapo_loss, decoupled_ppo_loss, drgrpo_loss, grpo_loss,
                                     policy_loss)

__all__ = [
    "AdvantageConfig", "AdvantageOutput", "LossInputError", "LossOutput", "NonFiniteError",
    "PRESETS",
    "PolicyLossConfig", "ScaleByESSState", "aggregate", "check_finite", "checked", "dapo_loss",
    "decoupled_ppo_loss", "drgrpo_loss", "effective_sample_size", "enable_checks", "ess_lr_scale",
    "grpo_loss", "group_advantages", "kl_estimate", "kl_penalized_rewards", "loss_denominator",
    "mc_grpo_advantages", "mismatch_stats", "opob_advantages", "opob_baseline",
    "per_sequence_grad_sq_norms", "policy_loss", "preset", "scale_by_ess", "sequence_log_weights",
    "validate_rewards",
]

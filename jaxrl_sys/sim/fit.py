"""The instance model fitted to RLBoost's own measured points (static pool, length sweep).

The roofline presets (`sim.presets`) derive every figure from datasheets and stated
efficiencies. RLBoost publishes measured end-to-end figures that constrain what its instances and
workload really do (spec/rlboost.md 1.8): one 2xH100 spot instance adds 37% throughput to a
Qwen3-14B node, six add 125% (1.37 x 1.64), and with the response cap swept from 5K to 14K
tokens the best gain grows from 1.47x (3 instances) to 2.22x (6). `InstanceFit` holds the
handful of figures fitted to those points (`sim.paper.calibration_points` runs them); the same
fit is then applied, unchanged, to 8B and 32B and to the Bamboo trace (held out).

Fitted (F) and taken-from-measurement (M) figures; sources in `sim/README.md`:
- decode_scale (F): decode step time relative to the roofline preset (all three terms);
- prefill_scale (F): prefill time relative to the roofline preset (the hand-off's re-prefill);
- length median / sigma / group_share (F): the response lengths of OpenR1-Math prompts under
  the 14K cap and their within-group correlation (RLBoost does not publish them);
- training MFU (M): torchtitan's 33-39% on 8 H100s (unchanged, `sim.presets`);
- start-up (M): not constrained by a static pool; `startup` (public figures, `sim.startup`).
"""
from __future__ import annotations

import dataclasses

from jaxrl_sys.sim.lengths import LengthDistribution
from jaxrl_sys.sim.presets import PRESETS, ModelPreset


@dataclasses.dataclass(frozen=True)
class InstanceFit:
  """Fitted figures applied on top of a roofline preset (see the module docstring).

  Attributes:
    decode_scale: multiplies `fixed_s`, `per_seq_s` and `per_ctx_token_s` of the decode curve.
    prefill_scale: multiplies the prefill per-token and attention costs.
    median, sigma, group_share: the clipped log-normal response lengths (`LengthDistribution`).
  """
  decode_scale: float = 1.0
  prefill_scale: float = 1.0
  median: float = 4000.0
  sigma: float = 0.9
  group_share: float = 0.5

  def __post_init__(self):
    if not (self.decode_scale > 0 and self.prefill_scale > 0):
      raise ValueError(f"InstanceFit: scales must be > 0, got {self}")
    LengthDistribution(self.median, self.sigma, group_share=self.group_share)  # validates

  def lengths(self, max_tokens: int = 14336) -> LengthDistribution:
    """The fitted response lengths under a response cap of `max_tokens`."""
    return LengthDistribution(self.median, self.sigma, max_tokens=max_tokens,
                              group_share=self.group_share)

  def apply(self, preset: ModelPreset) -> ModelPreset:
    """`preset` with the fitted decode and prefill costs (training figures unchanged)."""
    d, s = preset.decode, self.decode_scale
    decode = dataclasses.replace(d, fixed_s=d.fixed_s * s, per_seq_s=d.per_seq_s * s,
                                 per_ctx_token_s=d.per_ctx_token_s * s)
    return dataclasses.replace(
        preset, name=preset.name, decode=decode,
        prefill_s_per_token=preset.prefill_s_per_token * self.prefill_scale,
        prefill_attn_s=preset.prefill_attn_s * self.prefill_scale)


# The roofline model as it was before the fit (every figure derived; R1-like lengths).
ROOFLINE = InstanceFit()
# Fitted to the 14B static-pool points and the length-sweep end points (sim/paper.py).
FITTED = InstanceFit()


def fitted_presets(fit: InstanceFit = FITTED) -> dict[str, ModelPreset]:
  """Every roofline preset with `fit` applied, by name."""
  return {name: fit.apply(p) for name, p in PRESETS.items()}

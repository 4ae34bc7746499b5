"""The instance model fitted to RLBoost's own measured points (static pool, length sweep).

The roofline presets (`sim.presets`) derive every figure from datasheets and stated
efficiencies. RLBoost publishes measured end-to-end figures that constrain what its instances and
workload really do (RLBOOST.md 1.8): one 2xH100 spot instance adds 37% throughput to a
Qwen3-14B node, six add 125% (1.37 x 1.64), and with the response cap swept from 5K to 14K
tokens the best gain grows from 1.47x (3 instances) to 2.22x (6). `InstanceFit` holds the
handful of figures fitted to those points (`sim.points.calibration_points` runs them); the same
fit is then applied, unchanged, to 8B and 32B and to the Bamboo trace (held out).

Fitted (F) and taken-from-measurement (M) figures; sources in `sim/README.md`:
- step_extra_s (F): host-side seconds per decode step (scheduler, sampling with log-probs,
  streaming), overlapped with the GPU's work as SGLang's overlap scheduler runs it: a step takes
  the longer of the two (`decode.DecodeCurve.host_s`); fitted 37.5 ms in the eighth pass (before
  it, the same figure was added to the GPU's time: 10 ms in the sixth pass, 27.5 ms before);
- ctx_scale (F): attention over the KV relative to the roofline (fitted 1 in the eighth pass:
  KV reads at the roofline's 60% of HBM bandwidth; 2 before); decode_scale (F, left at 1): the
  weight-read and per-sequence terms;
- mem_fraction, max_running (M): RLBoost's release (SGLang at 0.6 of HBM, 256 sequences);
- trainer_resident_bytes_per_param (M): what the trainer keeps on its GPUs while its engines
  generate. The release runs FSDP with `param_offload=False`, `optimizer_offload=True` for the
  actor (fp32 parameters, 4 bytes) and leaves the reference policy (bf16, 2 bytes; on with the KL
  loss) at verl's default `param_offload=False`; both are built before the rollout engine, and
  SGLang sizes its KV pool from the memory free when it starts (`mem_fraction_static` of the
  total minus what is already taken). So 6 bytes per parameter, sharded over one node's 8 GPUs
  (`fsdp_size`: the whole node in the one-node scripts, 8 in the two-node one), come out of a
  local engine's KV. Where that leaves no KV at all (Qwen3-32B: 24.6 GB per GPU against the
  15.2 GB SGLang has left after its weights) the released settings cannot run the model, and
  the trainer is taken to offload its parameters (`param_offload=True`, as verl recommends for
  the reference above 7B and its 32B recipes set): the local engines hold an instance's KV;
- prefill_scale (F): prefill time relative to the roofline preset (the hand-off's re-prefill);
- length median / sigma / group_share (F): the response lengths of OpenR1-Math prompts under
  the 14K cap and their within-group correlation (RLBoost does not publish them). Fitted
  jointly with the decode figures to the 14B points and the release's 8B figures (sixth pass):
  sigma 0.6, median 4,521 (the clipped mean held at ~5,300 tokens, the release's 5.67M tokens
  per step of 128 x 8 [derived]; 2.7% of responses at the 14K cap); group share 0.25 (eighth
  pass; 0.1 before);
- train_scale (F): the training time relative to the presets' (torchtitan's 33-39% MFU on 8
  H100s, `sim.presets`); free in the eighth pass's fit, x1.75 (MFU 0.20): the paper's 14B
  figures leave ~528 s of a ~1,197 s co-located step to training and the trainer's wait (x1.6
  ours if it all trained), the release trains with gradient checkpointing (x1.2) and offloads
  the actor's optimizer to the CPU;
- start-up (M): not constrained by a static pool; `startup` (public figures, `sim.startup`).
"""
from __future__ import annotations

import dataclasses

from jaxrl_sys.sim.engine import EngineModel
from jaxrl_sys.sim.hardware import H100
from jaxrl_sys.sim.lengths import LengthDistribution
from jaxrl_sys.sim.presets import PRESETS, ModelPreset


@dataclasses.dataclass(frozen=True)
class InstanceFit:
  """Fitted figures applied on top of a roofline preset (see the module docstring).

  Attributes:
    decode_scale: multiplies `fixed_s` and `per_seq_s` of the decode curve (weight reads,
      per-sequence compute).
    ctx_scale: multiplies `per_ctx_token_s` (attention over the KV cache): decode rate vs
      context.
    prefill_scale: multiplies the prefill per-token and attention costs.
    mem_fraction: share of an instance's HBM for weights + KV cache (None: the preset's);
      RLBoost's release runs SGLang at 0.6, local and remote (M).
    max_running: most sequences an engine decodes at once (release: max_num_seqs 256) (M).
    trainer_resident_bytes_per_param: bytes per parameter the trainer keeps resident on the
      reserved GPUs during rollout, sharded over `trainer_shard_gpus`, taken out of a local
      engine's KV cache (M: fp32 actor + bf16 reference shards, 6; 0 = local engines hold as
      much KV as an instance).
    trainer_shard_gpus: GPUs the resident state is sharded over (M: the release's `fsdp_size`,
      one node of 8, also in its two-node script).
    offload_if_full: when the resident state leaves a local engine no KV, model parameter
      offload (the local engines hold an instance's KV) instead of raising.
    step_extra_s: the engine's host-side seconds per decode step (F: scheduling, sampling with
      log-probs, streaming; the roofline's 1 ms leaves them out), overlapped with the GPU's
      work (`DecodeCurve.host_s`: a step takes the longer of the two); it sets how slowly a
      lone sequence, such as the last response of a step, decodes.
    median, sigma, group_share: the clipped log-normal response lengths (`LengthDistribution`).
    train_scale: multiplies the training time per token (both terms). 1.75 in `FITTED` (eighth
      pass; 1 before): RLBoost's release trains with gradient checkpointing (6
      forward-equivalents per token instead of the presets' 5: x1.2) and a CPU-offloaded
      optimizer; its 8B figures imply ~245 s of training plus trainer wait per step (x1.28
      ours if the wait were zero), its 14B figures ~528 s (x1.6).
  """
  decode_scale: float = 1.0
  ctx_scale: float = 1.0
  prefill_scale: float = 1.0
  median: float = 4000.0
  sigma: float = 0.9
  group_share: float = 0.5
  mem_fraction: float | None = None
  max_running: int = 1024
  step_extra_s: float = 0.0
  trainer_resident_bytes_per_param: float = 0.0
  trainer_shard_gpus: int = 8
  offload_if_full: bool = True
  train_scale: float = 1.0

  def __post_init__(self):
    if self.trainer_resident_bytes_per_param < 0 or self.trainer_shard_gpus < 1:
      raise ValueError(f"InstanceFit: need trainer_resident_bytes_per_param >= 0 and "
                       f"trainer_shard_gpus >= 1, got {self.trainer_resident_bytes_per_param}, "
                       f"{self.trainer_shard_gpus}")
    if not (self.decode_scale > 0 and self.ctx_scale > 0 and self.prefill_scale > 0
            and self.train_scale > 0
            and self.max_running >= 1 and self.step_extra_s >= 0
            and (self.mem_fraction is None or 0 < self.mem_fraction <= 1)):
      raise ValueError(f"InstanceFit: need scales > 0, max_running >= 1, step_extra_s >= 0, "
                       f"0 < mem_fraction <= 1; got {self}")
    LengthDistribution(self.median, self.sigma, group_share=self.group_share)  # validates

  def lengths(self, max_tokens: int = 14336) -> LengthDistribution:
    """The fitted response lengths under a response cap of `max_tokens`."""
    return LengthDistribution(self.median, self.sigma, max_tokens=max_tokens,
                              group_share=self.group_share)

  def engine(self, base: EngineModel = EngineModel()) -> EngineModel:
    """The engine scheduler with the fitted batch cap."""
    return dataclasses.replace(base, max_running=self.max_running)

  def apply(self, preset: ModelPreset) -> ModelPreset:
    """`preset` with the fitted decode and prefill costs and its local engines' KV (training
    figures unchanged)."""
    d, s = preset.decode, self.decode_scale
    kv = d.kv_capacity_tokens
    if self.mem_fraction is not None:
      hbm = preset.gpus_per_instance * H100.gpu_mem_bytes * self.mem_fraction
      kv = int((hbm - preset.weight_bytes) // preset.kv_bytes_per_token)
      if kv <= 0:
        raise ValueError(f"InstanceFit: {preset.name}'s weights do not fit "
                         f"{self.mem_fraction:g} of the instance's memory")
    local_kv = None
    if self.trainer_resident_bytes_per_param:
      resident = (self.trainer_resident_bytes_per_param * preset.params_b * 1e9
                  / self.trainer_shard_gpus * preset.gpus_per_instance)
      local_kv = int(kv - resident // preset.kv_bytes_per_token)
      if local_kv <= 0 and self.offload_if_full:
        local_kv = None  # the trainer offloads its parameters: nothing resident
      elif local_kv <= 0:
        raise ValueError(f"InstanceFit: {preset.name}'s resident trainer state "
                         f"({resident / 1e9:.1f} GB per local engine) leaves no KV cache; "
                         f"set offload_if_full=True to model parameter offload")
    decode = dataclasses.replace(d, fixed_s=d.fixed_s * s, host_s=d.host_s + self.step_extra_s,
                                 per_seq_s=d.per_seq_s * s,
                                 per_ctx_token_s=d.per_ctx_token_s * self.ctx_scale,
                                 kv_capacity_tokens=kv)
    return dataclasses.replace(
        preset, name=preset.name, decode=decode, local_kv_tokens=local_kv,
        prefill_s_per_token=preset.prefill_s_per_token * self.prefill_scale,
        prefill_attn_s=preset.prefill_attn_s * self.prefill_scale,
        train_s_per_token=preset.train_s_per_token * self.train_scale,
        train_attn_s=preset.train_attn_s * self.train_scale)


# The roofline model as it was before the fit (every figure derived; R1-like lengths).
ROOFLINE = InstanceFit()
# Fitted to the 14B static-pool points and to what Algorithm 1 settles on (the length sweep's
# N_prem with the cap on, the saturation, the windows, the rollout share; sim/points.py), with
# the training time free. Eighth pass: the decode's shape changed (the host's work per step
# overlaps the GPU's instead of adding to it, `DecodeCurve.host_s`), host 37.5 ms per step,
# attention at the roofline's rate (x1; x2 before), training x1.75, a within-group share of 0.25
# (sim/README.md, "Calibrated on the controller's outputs"; the sixth pass added 10 ms of host
# time to the GPU's and trained at x1).
FITTED = InstanceFit(ctx_scale=1.0, step_extra_s=0.0375, median=4521.0, sigma=0.6,
                     group_share=0.25, mem_fraction=0.6, max_running=256,
                     trainer_resident_bytes_per_param=6.0, train_scale=1.75)


def fitted_presets(fit: InstanceFit = FITTED) -> dict[str, ModelPreset]:
  """Every roofline preset with `fit` applied, by name."""
  return {name: fit.apply(p) for name, p in PRESETS.items()}

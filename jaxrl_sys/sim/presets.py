"""Model presets: the cost figures of one model on RLBoost's hardware, derived in one place.

`derive_preset(name, arch, ...)` turns an architecture (from the model's Hugging Face config)
and a `Hardware` into every figure the simulator uses; `QWEN3_8B`, `QWEN3_14B`, `QWEN3_32B` are
RLBoost's three models (RLBOOST.md 1.7): rollout instances of 2xH100 with TP=2, training
on one 8xH100 node (8B, 14B) or two (32B). The derivation and each constant's source are in
the comments below and in `sim/README.md`; `sim.calibrate` builds a preset from measurements
instead.
"""
from __future__ import annotations

import dataclasses

from jaxrl_sys.sim.decode import DecodeCurve, plateau_batch
from jaxrl_sys.sim.hardware import GCP_A3, H100, Hardware, Network

BF16_BYTES = 2


@dataclasses.dataclass(frozen=True)
class ModelArch:
  """Dense decoder shape.

  Attributes:
    params: parameter count (embeddings and LM head included).
    num_layers, hidden, num_heads, num_kv_heads, head_dim: transformer shape.
  """
  params: float
  num_layers: int
  hidden: int
  num_heads: int
  num_kv_heads: int
  head_dim: int

  @property
  def weight_bytes(self) -> int:
    """Bytes of the bf16 weights."""
    return int(round(self.params * BF16_BYTES))

  @property
  def kv_bytes_per_token(self) -> int:
    """Bytes of bf16 K and V per token over all layers."""
    return 2 * self.num_layers * self.num_kv_heads * self.head_dim * BF16_BYTES

  @property
  def attn_flops_per_ctx_token(self) -> float:
    """Forward attention FLOPs per token per token of causal sequence length S, averaged over
    the sequence (QK^T and AV: 4 * q_dim * position per layer, mean position S / 2)."""
    return 2.0 * self.num_layers * self.num_heads * self.head_dim


@dataclasses.dataclass(frozen=True)
class ModelPreset:
  """Everything the simulator needs about one model; times in seconds, sizes in bytes.

  Attributes:
    name: label.
    params_b: parameters, billions.
    num_layers, hidden: shape (for reference; the derived costs below already use them).
    weight_bytes: bf16 weights (what a weight pull moves).
    kv_bytes_per_token: KV-cache bytes per token.
    decode: decode step-time curve of one rollout instance.
    prefill_s_per_token: prefill seconds per token (linear part) on one rollout instance.
    prefill_attn_s: prefill seconds per token per token of sequence length (attention part).
    prefill_call_s: fixed seconds per prefill call.
    train_s_per_token: training seconds per token on one reserved node, all passes of an RL
      step (policy forward + backward, reference and old-policy forwards), linear part.
    train_attn_s: the same per token per token of mean sequence length (attention part).
    train_nodes: reserved training nodes (8 GPUs each).
    step_overhead_s: per-step seconds outside forward/backward: optimizer step, resharding the
      new weights to the local engines, the host-buffer copy for remote pulls, switching the
      node between training and rollout.
    gpus_per_instance: GPUs per rollout instance (its TP degree).
    gpus_per_node: GPUs per reserved node.
    local_kv_tokens: KV-cache tokens of a rollout engine on the reserved (training) nodes, when
      it differs from a spot instance's `decode.kv_capacity_tokens` (None: the same); e.g. the
      trainer's resident FSDP shards leave the co-located engine less memory.
  """
  name: str
  params_b: float
  num_layers: int
  hidden: int
  weight_bytes: int
  kv_bytes_per_token: int
  decode: DecodeCurve
  prefill_s_per_token: float
  prefill_attn_s: float
  prefill_call_s: float
  train_s_per_token: float
  train_attn_s: float
  train_nodes: int
  step_overhead_s: float
  gpus_per_instance: int = 2
  gpus_per_node: int = 8
  local_kv_tokens: int | None = None

  def __post_init__(self):
    if self.local_kv_tokens is not None and self.local_kv_tokens < 1:
      raise ValueError(f"ModelPreset {self.name}: local_kv_tokens must be >= 1 or None, got "
                       f"{self.local_kv_tokens}")
    if not (self.weight_bytes > 0 and self.prefill_s_per_token > 0 and self.train_s_per_token > 0
            and self.train_nodes >= 1 and self.step_overhead_s >= 0 and self.prefill_attn_s >= 0
            and self.train_attn_s >= 0 and self.prefill_call_s >= 0):
      raise ValueError(f"ModelPreset {self.name}: sizes and costs must be positive, got {self}")

  def local(self) -> "ModelPreset":
    """The preset a rollout engine on the reserved nodes runs (its own KV capacity)."""
    if self.local_kv_tokens is None:
      return self
    return dataclasses.replace(self, decode=dataclasses.replace(
        self.decode, kv_capacity_tokens=self.local_kv_tokens), local_kv_tokens=None)

  def plateau_batch(self, mean_context: float = 0.0, frac: float = 0.9) -> int:
    """B of one rollout instance at this mean context (see `decode.plateau_batch`)."""
    return plateau_batch(self.decode, frac, mean_context)


def derive_preset(name: str, arch: ModelArch, hardware: Hardware = H100, train_nodes: int = 1,
                  train_mfu: float = 0.35, train_passes: float = 5.0,
                  network: Network = GCP_A3, switch_s: float = 3.0) -> ModelPreset:
  """Roofline-style figures of `arch` on `hardware` (formulas in `sim/README.md`).

  Args:
    train_mfu: model FLOPs utilisation of training (fraction of peak).
    train_passes: forward-equivalents per trained token: policy forward + backward (3), the
      reference policy's forward for the KL term (1) and the old-policy log-prob forward
      (1, as veRL's trainer recomputes it each step).
    switch_s: seconds to switch a node between training and local rollout (engine wake-up,
      KV-cache allocation); an assumption.
  """
  hw, tp, p = hardware, hardware.gpus_per_instance, arch.params
  inst_bw, inst_flops = tp * hw.hbm_bytes_per_s, tp * hw.peak_flops
  decode = DecodeCurve(
      fixed_s=(arch.weight_bytes / (inst_bw * hw.weight_read_eff)
               + 2 * arch.num_layers * hw.allreduce_s + hw.engine_step_s),
      per_seq_s=2 * p / (inst_flops * hw.decode_flop_eff),
      per_ctx_token_s=arch.kv_bytes_per_token / (inst_bw * hw.kv_read_eff),
      kv_capacity_tokens=max(0, int((tp * hw.gpu_mem_bytes * hw.mem_fraction - arch.weight_bytes)
                                    // arch.kv_bytes_per_token)))
  if decode.kv_capacity_tokens == 0:
    raise ValueError(f"derive_preset {name}: weights do not fit a {tp}-GPU instance")
  prefill_rate = inst_flops * hw.prefill_flop_eff
  node_rate = hw.gpus_per_node * hw.peak_flops * train_mfu
  n_train_gpus = hw.gpus_per_node * train_nodes
  # AdamW with fp32 master weights, grads and two moments: ~32 bytes read + written per param.
  optimizer_s = 32 * p / (n_train_gpus * hw.hbm_bytes_per_s * hw.weight_read_eff)
  reshard_s = arch.weight_bytes / hw.nvlink_bytes_per_s
  host_copy_s = arch.weight_bytes / network.host_copy_bytes_per_s
  return ModelPreset(
      name=name, params_b=p / 1e9, num_layers=arch.num_layers, hidden=arch.hidden,
      weight_bytes=arch.weight_bytes, kv_bytes_per_token=arch.kv_bytes_per_token, decode=decode,
      prefill_s_per_token=2 * p / prefill_rate,
      prefill_attn_s=arch.attn_flops_per_ctx_token / prefill_rate,
      prefill_call_s=hw.prefill_call_s,
      train_s_per_token=train_passes * 2 * p / node_rate,
      train_attn_s=train_passes * arch.attn_flops_per_ctx_token / node_rate,
      train_nodes=train_nodes, step_overhead_s=optimizer_s + reshard_s + host_copy_s + switch_s,
      gpus_per_instance=tp, gpus_per_node=hw.gpus_per_node)


# Shapes from the Hugging Face configs / model cards of Qwen/Qwen3-8B, Qwen3-14B, Qwen3-32B
# (model cards: 8.2B / 14.8B / 32.8B parameters; 36 / 40 / 64 layers; 32 / 40 / 64 query heads,
# 8 KV heads; head_dim 128; hidden 4096 / 5120 / 5120; intermediate 12288 / 17408 / 25600;
# vocab 151936, untied LM head). Parameter counts recomputed from those shapes.
QWEN3_8B_ARCH = ModelArch(params=8.1907e9, num_layers=36, hidden=4096, num_heads=32,
                          num_kv_heads=8, head_dim=128)
QWEN3_14B_ARCH = ModelArch(params=14.768e9, num_layers=40, hidden=5120, num_heads=40,
                           num_kv_heads=8, head_dim=128)
QWEN3_32B_ARCH = ModelArch(params=32.762e9, num_layers=64, hidden=5120, num_heads=64,
                           num_kv_heads=8, head_dim=128)

# Training MFU: torchtitan reports 33-39% MFU for Llama-3.1-8B, FSDP on 8 H100s, bf16
# (github.com/pytorch/torchtitan docs/performance.md); 0.35 for one node. Two nodes (32B):
# 0.30, an assumption - FSDP all-gathers then cross the inter-node fabric, and RLBoost
# attributes part of its lead over veRL.2x to two-node FSDP overhead (RLBOOST.md 1.8).
QWEN3_8B = derive_preset("qwen3-8b", QWEN3_8B_ARCH, train_nodes=1, train_mfu=0.35)
QWEN3_14B = derive_preset("qwen3-14b", QWEN3_14B_ARCH, train_nodes=1, train_mfu=0.35)
QWEN3_32B = derive_preset("qwen3-32b", QWEN3_32B_ARCH, train_nodes=2, train_mfu=0.30)

PRESETS = {p.name: p for p in (QWEN3_8B, QWEN3_14B, QWEN3_32B)}


def get_preset(name: str) -> ModelPreset:
  """A preset by name ("qwen3-8b", "qwen3-14b", "qwen3-32b")."""
  try:
    return PRESETS[name.lower()]
  except KeyError:
    raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None

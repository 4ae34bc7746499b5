"""Frozen configuration of the policy transformer (dense; MoE fields in `MoEConfig`)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from jaxrl_sys.utils.config import config_from_dict

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic")


def dtype_name(dtype: Any) -> Any:
  """"float32" for "float32", `jnp.float32`, `np.float32` or `np.dtype("float32")`; anything
  that names no dtype is returned as it is (and refused by the caller)."""
  if isinstance(dtype, str) or dtype is None:
    return dtype
  try:
    return jnp.dtype(dtype).name
  except TypeError:
    return dtype


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """Rotary position embedding: base `theta` and optional frequency scaling.

  `type` is one of "default", "linear" (positions / factor), "llama3" (Llama 3.1 band-wise
  scaling), "yarn" (NTK-by-parts with attention scaling), "dynamic" (treated as default below
  the original context, as HF does for short inputs).
  """
  theta: float = 10000.0
  type: str = "default"
  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float | None = None

  def __post_init__(self):
    if self.type not in ROPE_TYPES:
      raise ValueError(f"unknown rope type {self.type!r}; supported: {ROPE_TYPES}")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """Mixture-of-Experts block settings (used when `ModelConfig.moe` is set; see models/moe/).

  Shared experts (`num_shared_experts > 0`) are fused into one SwiGLU MLP of width
  `shared_intermediate_size` (0 = `num_shared_experts * expert_intermediate_size`).
  `capacity_factor` > 0 drops assignments beyond `ceil(cf * k * valid_tokens / num_experts)` per
  expert (first choices before second choices, earlier tokens first); 0 = dropless.
  `bip_rule` is the BIP q-update ("midpoint" of the c-th/(c+1)-th reduced scores, or "kth" =
  the (c+1)-th plus a 1e-4 margin). `expert_axis` names the mesh axis that shards experts for
  `implementation="expert_parallel"`; `ep_dispatch` picks its token collective ("dense" padded
  all_to_all, runs everywhere; "ragged" = ragged_all_to_all, GPU/TPU only; "ragged_emulated" = the
  ragged protocol over all_gather, for CPU tests).
  `grouped_matmul_impl` is passed to `jaxrl_sys.kernels.grouped_matmul` when that kernel exists.
  `implementation`: "auto" runs "ragged" (grouped matmul) on GPU/TPU; on CPU it runs "slots"
  (expert-major slot buffers, one batched GEMM, an exact fallback when an expert overflows its
  slots) at decode sizes and "segments" (expert-sorted segments in chunks, exact, no capacity)
  at training sizes (`moe.resolve_implementation`); "blocked" is expert-sorted row blocks over
  gathered weights; "dense" is the all-experts reference; "expert_parallel" shards the experts
  over `expert_axis`.
  """
  num_experts: int = 8
  num_experts_per_tok: int = 2
  expert_intermediate_size: int = 64
  num_shared_experts: int = 0
  shared_intermediate_size: int = 0
  gating: str = "softmax"            # "softmax" | "sigmoid"
  norm_topk_prob: bool = True
  routed_scaling_factor: float = 1.0
  capacity_factor: float = 0.0       # 0 = dropless
  balancing: str = "none"            # "none" | "aux_loss" | "aux_free" | "bip"
  aux_loss_coef: float = 1e-2
  bias_update_rate: float = 1e-3     # aux-free u
  bip_iterations: int = 4            # BIP dual sweeps per batch (0 = use the stored q only)
  bip_rule: str = "midpoint"         # "midpoint" | "kth"
  # "auto" | "ragged" | "slots" | "segments" | "blocked" | "dense" | "expert_parallel"
  implementation: str = "auto"
  shared_expert_gate: bool = False   # Qwen2-MoE style sigmoid gate on the shared expert
  expert_axis: str = "model"         # mesh axis of expert parallelism
  ep_dispatch: str = "dense"         # "dense" | "ragged" | "ragged_emulated"
  # kernels.grouped_matmul impl: "auto" (`jaxrl_sys.backend`: Pallas on GPU, ragged_dot
  # elsewhere) | "pallas" | "xla" (jax.lax.ragged_dot) | "xla_tiled" (memory-safe XLA fallback)
  grouped_matmul_impl: str = "auto"

  def __post_init__(self):
    choices = {"gating": ("softmax", "sigmoid"),
               "balancing": ("none", "aux_loss", "aux_free", "bip"),
               "bip_rule": ("midpoint", "kth"),
               "ep_dispatch": ("dense", "ragged", "ragged_emulated"),
               "grouped_matmul_impl": ("auto", "pallas", "xla", "xla_tiled"),
               "implementation": ("auto", "ragged", "slots", "segments", "blocked",
                                  "dense", "expert_parallel")}
    for name, ok in choices.items():
      if getattr(self, name) not in ok:
        raise ValueError(f"MoEConfig.{name}={getattr(self, name)!r}; use one of {list(ok)}")
    if not 1 <= self.num_experts_per_tok <= self.num_experts:
      raise ValueError(f"MoEConfig.num_experts_per_tok={self.num_experts_per_tok} must be in "
                       f"[1, num_experts={self.num_experts}]")
    if self.expert_intermediate_size <= 0 or self.capacity_factor < 0 or self.bip_iterations < 0:
      raise ValueError("MoEConfig: expert_intermediate_size must be positive, capacity_factor and "
                       "bip_iterations non-negative")

  @property
  def shared_width(self) -> int:
    """Width of the fused shared-expert MLP (0 when there are no shared experts)."""
    if self.num_shared_experts <= 0:
      return 0
    return self.shared_intermediate_size or self.num_shared_experts * self.expert_intermediate_size


LORA_TARGETS = ("attention", "q", "k", "v", "o", "mlp", "gate", "up", "down", "experts", "shared")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Low-rank adapters on a frozen base (LoRA): each targeted projection computes
  `x @ W + (alpha / rank) * (x @ A) @ B`, W frozen, A `[in, rank]` and B `[rank, out]` trained
  (B starts at zero, so the adapted model starts as the base). See `models/lora.py`.

  Attributes:
    rank: adapter rank r (0 = off: every parameter is trained).
    alpha: scale numerator: the update is (alpha / rank) * x @ A @ B.
    targets: comma-separated projections to adapt: attention (= q,k,v,o), mlp (= gate,up,down:
      the dense MLP, or on an MoE model the routed experts and the shared expert), experts
      (routed experts only, one adapter pair per expert), shared (the shared expert only), or
      single names q, k, v, o, gate, up, down. The MoE router is never adapted: the engine's
      captured routes and their replay (R2/R3) are the base router's on the adapted hidden
      states, computed the same way by the engine and the trainer.
    dropout: dropout rate on the adapters' input in the train step (0 = none); the rollout
      engines never drop, so a rate > 0 makes the trainer's log-probs differ from the
      rollout's.
    merge: the rollout engines add (alpha / rank) * A @ B to their copy of the base once per
      version (float32 sum, then one cast to the rollout dtype) and decode with plain matmuls;
      in bfloat16 that rounds away updates below the base weights' resolution (docs/lora.md).
      Off: the engines apply x @ A @ B beside the frozen matmul (exact).
  """
  rank: int = 0
  alpha: float = 16.0
  targets: str = "attention,mlp"
  dropout: float = 0.0
  merge: bool = False

  def __post_init__(self):
    if self.rank < 0:
      raise ValueError(f"--lora.rank={self.rank} must be >= 0 (0 = off)")
    if not self.alpha > 0:
      raise ValueError(f"--lora.alpha={self.alpha} must be > 0")
    if not 0 <= self.dropout < 1:
      raise ValueError(f"--lora.dropout={self.dropout} must be in [0, 1)")
    names = self.target_names
    bad = [n for n in names if n not in LORA_TARGETS]
    if bad or not names:
      raise ValueError(f"--lora.targets={self.targets!r}: unknown target(s) {bad}; use a "
                       f"comma-separated list of {list(LORA_TARGETS)}")

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    """alpha / rank, the factor of the adapters' update."""
    return self.alpha / self.rank

  @property
  def target_names(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.strip() for t in self.targets.split(",") if t.strip()))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer (Llama / Qwen2 / Qwen3 family).

  Shapes: embeddings `[vocab_size, hidden_size]`, attention with `num_heads` query heads and
  `num_kv_heads` key/value heads of `head_dim` each (grouped-query attention), SwiGLU MLP of
  width `intermediate_size`. `param_dtype` / `compute_dtype` are "float32" or "bfloat16".
  """
  vocab_size: int = 2048
  hidden_size: int = 256
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 64
  intermediate_size: int = 512
  max_seq_len: int = 2048
  rms_norm_eps: float = 1e-6
  rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
  tie_embeddings: bool = False
  qk_norm: bool = False              # Qwen3
  attention_bias: bool = False       # Qwen2 q/k/v bias
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  # "auto" (`jaxrl_sys.backend`: cuDNN / Pallas on GPU, XLA elsewhere) | "xla" | "pallas" | "cudnn"
  attention_impl: str = "auto"
  moe: MoEConfig | None = None
  architecture: str = "Qwen2ForCausalLM"  # HF architecture name used on export
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  # Low-rank adapters on the frozen parameters (None or rank 0: none; `models/lora.py`).
  lora: LoraConfig | None = None

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "intermediate_size", "max_seq_len"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                       f"({self.num_kv_heads})")
    for name in ("param_dtype", "compute_dtype"):
      object.__setattr__(self, name, dtype_name(getattr(self, name)))
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; use one of {list(_DTYPES)}")
    if self.attention_impl not in ("auto", "xla", "pallas", "cudnn"):
      raise ValueError(f"attention_impl must be auto|xla|pallas|cudnn, got "
                       f"{self.attention_impl!r}")
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
    if self.lora is not None and not self.lora.enabled:
      object.__setattr__(self, "lora", None)

  @property
  def pdtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def cdtype(self):
    return _DTYPES[self.compute_dtype]

  @property
  def num_groups(self) -> int:
    return self.num_heads // self.num_kv_heads

  @staticmethod
  def from_dict(d: Mapping[str, Any]) -> "ModelConfig":
    """Strict constructor: unknown keys raise ValueError naming them."""
    return config_from_dict(ModelConfig, d)

"""Pieces shared by the Hugging Face importers/exporters (`models/hf/checkpoint.py` for the dense
architectures, `models/hf/moe.py` for Qwen3-MoE): the architecture registry, RoPE and dense
config translation, and the tensor-name mapping of embeddings, norms and attention.

Both importers import this module; neither imports the other's internals.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxrl_sys.models.config import ModelConfig, RopeConfig

# architecture name -> (config_from_hf, to_params, from_params, config_to_hf)
_ARCHS: dict[str, tuple[Callable, Callable, Callable, Callable]] = {}
_MODEL_TYPES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def register_architecture(name: str, config_from_hf, to_params, from_params, config_to_hf):
  """Adds an HF architecture: `config_from_hf(cfg dict) -> ModelConfig`, `to_params(tensors,
  config) -> params`, `from_params(params, config) -> tensors`, `config_to_hf(config) -> dict`."""
  _ARCHS[name] = (config_from_hf, to_params, from_params, config_to_hf)


def supported_architectures() -> list[str]:
  return sorted(_ARCHS)


def architecture(name: str, where: str) -> tuple[Callable, Callable, Callable, Callable]:
  """(config_from_hf, to_params, from_params, config_to_hf) of a registered architecture.

  Raises:
    ValueError: naming the architecture, `where` it came from, and the supported ones.
  """
  if name not in _ARCHS:
    raise ValueError(f"unsupported architecture {name!r} in {where}; "
                     f"supported: {supported_architectures()}")
  return _ARCHS[name]


def rope_from_hf(cfg: dict) -> RopeConfig:
  rp = dict(cfg.get("rope_parameters") or {})
  rs = dict(cfg.get("rope_scaling") or {})
  merged = {**rs, **rp}
  theta = merged.get("rope_theta", cfg.get("rope_theta", 10000.0))
  rtype = merged.get("rope_type", merged.get("type", "default")) or "default"
  kw: dict[str, Any] = {"theta": float(theta), "type": rtype}
  for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
            "beta_fast", "beta_slow", "attention_factor"):
    if merged.get(k) is not None:
      kw[k] = merged[k]
  return RopeConfig(**kw)


def rope_to_hf(rope: RopeConfig) -> dict:
  out: dict[str, Any] = {"rope_theta": rope.theta}
  if rope.type != "default":
    scaling = {"rope_type": rope.type, "factor": rope.factor}
    if rope.type == "llama3":
      scaling.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor,
                     original_max_position_embeddings=rope.original_max_position_embeddings)
    if rope.type == "yarn":
      scaling.update(beta_fast=rope.beta_fast, beta_slow=rope.beta_slow,
                     original_max_position_embeddings=rope.original_max_position_embeddings)
      if rope.attention_factor is not None:
        scaling["attention_factor"] = rope.attention_factor
    out["rope_scaling"] = scaling
  return out


def dense_config_from_hf(cfg: dict, arch: str) -> ModelConfig:
  """ModelConfig for a Llama / Qwen2 / Qwen3 config.json dict."""
  if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
    raise ValueError(f"{arch}: sliding-window attention is not supported")
  if cfg.get("mlp_bias"):
    raise ValueError(f"{arch}: mlp_bias=True is not supported")
  if arch in ("LlamaForCausalLM", "MistralForCausalLM") and cfg.get("attention_bias"):
    raise ValueError(f"{arch}: attention_bias=True (o_proj bias) is not supported")
  heads = cfg["num_attention_heads"]
  torch_dtype = cfg.get("dtype", cfg.get("torch_dtype")) or "float32"
  dtype = {"bfloat16": "bfloat16", "float16": "float32"}.get(str(torch_dtype), "float32")
  return ModelConfig(
      vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
      num_layers=cfg["num_hidden_layers"], num_heads=heads,
      num_kv_heads=cfg.get("num_key_value_heads") or heads,
      head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
      intermediate_size=cfg["intermediate_size"],
      max_seq_len=cfg.get("max_position_embeddings", 2048),
      rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope=rope_from_hf(cfg),
      tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
      qk_norm=arch == "Qwen3ForCausalLM",
      attention_bias=arch == "Qwen2ForCausalLM" or (
          arch == "Qwen3ForCausalLM" and bool(cfg.get("attention_bias"))),
      param_dtype=dtype, compute_dtype=dtype, architecture=arch,
      bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id"))


def dense_config_to_hf(c: ModelConfig) -> dict:
  out = {
      "architectures": [c.architecture], "model_type": _MODEL_TYPES.get(c.architecture, "llama"),
      "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
      "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
      "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
      "intermediate_size": c.intermediate_size, "max_position_embeddings": c.max_seq_len,
      "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": c.tie_embeddings,
      "hidden_act": "silu", "torch_dtype": c.param_dtype, "dtype": c.param_dtype,
      "attention_dropout": 0.0, "use_cache": True, **rope_to_hf(c.rope)}
  if c.architecture == "Qwen3ForCausalLM":
    out["attention_bias"] = c.attention_bias
  if c.architecture == "LlamaForCausalLM":
    out.update(attention_bias=False, mlp_bias=False)
  if c.bos_token_id is not None:
    out["bos_token_id"] = c.bos_token_id
  if c.eos_token_id is not None:
    eos = c.eos_token_id
    out["eos_token_id"] = list(eos) if isinstance(eos, tuple) else eos
  return out


class TensorTaker:
  """Pops tensors by name, collecting the names that are missing."""

  def __init__(self, tensors: dict[str, np.ndarray]):
    self.tensors, self.missing = dict(tensors), []

  def take(self, name):
    if name not in self.tensors:
      self.missing.append(name)
      return None
    return self.tensors.pop(name)

  def stack(self, fmt: str, n: int, fn=lambda a: a):
    arrs = [self.take(fmt.format(i)) for i in range(n)]
    if any(a is None for a in arrs):
      return None
    return np.stack([fn(a) for a in arrs])

  def finish(self, where: str):
    if self.missing:
      raise ValueError(f"{where}: missing tensor(s) in the checkpoint: {self.missing[:12]}"
                       + (f" (+{len(self.missing) - 12} more)" if len(self.missing) > 12 else ""))
    rest = [k for k in self.tensors if not k.endswith(_IGNORED_SUFFIXES)]
    return rest


def attention_to_params(t: TensorTaker, c: ModelConfig,
                        prefix: str = "model.layers.{}.self_attn.") -> dict:
  L, D, Hq, Hkv, Dh = c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
  a = {"wq": t.stack(prefix + "q_proj.weight", L, lambda w: w.T.reshape(D, Hq, Dh)),
       "wk": t.stack(prefix + "k_proj.weight", L, lambda w: w.T.reshape(D, Hkv, Dh)),
       "wv": t.stack(prefix + "v_proj.weight", L, lambda w: w.T.reshape(D, Hkv, Dh)),
       "wo": t.stack(prefix + "o_proj.weight", L, lambda w: w.T.reshape(Hq, Dh, D))}
  if c.attention_bias:
    a.update(bq=t.stack(prefix + "q_proj.bias", L, lambda w: w.reshape(Hq, Dh)),
             bk=t.stack(prefix + "k_proj.bias", L, lambda w: w.reshape(Hkv, Dh)),
             bv=t.stack(prefix + "v_proj.bias", L, lambda w: w.reshape(Hkv, Dh)))
  if c.qk_norm:
    a.update(q_norm=t.stack(prefix + "q_norm.weight", L),
             k_norm=t.stack(prefix + "k_norm.weight", L))
  return a


def attention_from_params(a: dict, c: ModelConfig,
                          prefix: str = "model.layers.{}.self_attn.") -> dict:
  """HF attention tensors. Qwen2 always has q/k/v biases in HF: a bias-free config exports
  zero biases (which import back as `attention_bias=True` with zeros, the same function)."""
  D = c.hidden_size
  out = {}
  for i in range(c.num_layers):
    p = prefix.format(i)
    out[p + "q_proj.weight"] = a["wq"][i].reshape(D, -1).T
    out[p + "k_proj.weight"] = a["wk"][i].reshape(D, -1).T
    out[p + "v_proj.weight"] = a["wv"][i].reshape(D, -1).T
    out[p + "o_proj.weight"] = a["wo"][i].reshape(-1, D).T
    if c.attention_bias:
      for n in ("q", "k", "v"):
        out[p + f"{n}_proj.bias"] = a[f"b{n}"][i].reshape(-1)
    elif c.architecture in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"):
      for n, w in (("q", "wq"), ("k", "wk"), ("v", "wv")):
        out[p + f"{n}_proj.bias"] = np.zeros(a[w][i].shape[1] * a[w][i].shape[2], a[w].dtype)
    if c.qk_norm:
      out[p + "q_norm.weight"] = a["q_norm"][i]
      out[p + "k_norm.weight"] = a["k_norm"][i]
  return out


def common_to_params(t: TensorTaker, c: ModelConfig) -> dict:
  L = c.num_layers
  params = {"embed": t.take("model.embed_tokens.weight"), "final_norm": t.take("model.norm.weight"),
            "layers": {"attn_norm": t.stack("model.layers.{}.input_layernorm.weight", L),
                       "mlp_norm": t.stack("model.layers.{}.post_attention_layernorm.weight", L),
                       "attn": attention_to_params(t, c)}}
  if not c.tie_embeddings:
    w = t.take("lm_head.weight")
    params["unembed"] = None if w is None else w.T
  else:
    t.tensors.pop("lm_head.weight", None)
  return params


def common_from_params(params: dict, c: ModelConfig) -> dict:
  out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
  for i in range(c.num_layers):
    out[f"model.layers.{i}.input_layernorm.weight"] = params["layers"]["attn_norm"][i]
    out[f"model.layers.{i}.post_attention_layernorm.weight"] = params["layers"]["mlp_norm"][i]
  out.update(attention_from_params(params["layers"]["attn"], c))
  if not c.tie_embeddings:
    out["lm_head.weight"] = params["unembed"].T
  return out

"""Hugging Face import/export of Qwen3-MoE (`Qwen3MoeForCausalLM`), registered in the registry of
models/hf/common.py (models/hf/checkpoint.py imports this module).

Checkpoint tensors per layer i (what `save_pretrained` writes, transformers 4.x and 5.x):
  model.layers.{i}.mlp.gate.weight                     [E, D]   -> router [D, E]
  model.layers.{i}.mlp.experts.{e}.gate_proj.weight    [F, D]   -> w_gate[e] [D, F]
  model.layers.{i}.mlp.experts.{e}.up_proj.weight      [F, D]   -> w_up[e]   [D, F]
  model.layers.{i}.mlp.experts.{e}.down_proj.weight    [D, F]   -> w_down[e] [F, D]
Also accepted on import: the fused in-memory layout of transformers 5
(`mlp.experts.gate_up_proj [E, 2F, D]`, `mlp.experts.down_proj [E, D, F]`). Export always
writes the per-expert layout. Only all-MoE stacks are supported (`mlp_only_layers` empty,
`decoder_sparse_step` 1).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_sys.models.hf import common as hf_common
from jaxrl_sys.models.config import ModelConfig, MoEConfig

ARCH = "Qwen3MoeForCausalLM"
_EXPERT = "model.layers.{}.mlp.experts.{}."


def config_from_hf(cfg: dict) -> ModelConfig:
  """ModelConfig (with `moe`) for a Qwen3-MoE config.json dict; balancing "none", dropless."""
  if cfg.get("mlp_only_layers"):
    raise ValueError(f"{ARCH}: mlp_only_layers={cfg['mlp_only_layers']} (dense layers between MoE "
                     "layers) is not supported")
  if int(cfg.get("decoder_sparse_step", 1)) != 1:
    raise ValueError(f"{ARCH}: decoder_sparse_step={cfg['decoder_sparse_step']} is not supported")
  num_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
  if num_experts is None:
    raise ValueError(f"{ARCH}: config.json has neither num_experts nor num_local_experts")
  base = hf_common.dense_config_from_hf(cfg, "Qwen3ForCausalLM")
  moe = MoEConfig(num_experts=int(num_experts), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                  expert_intermediate_size=int(cfg["moe_intermediate_size"]), gating="softmax",
                  norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                  aux_loss_coef=float(cfg.get("router_aux_loss_coef", 1e-3)))
  return dataclasses.replace(base, architecture=ARCH, moe=moe)


def config_to_hf(c: ModelConfig) -> dict:
  m = c.moe
  if m is None or m.shared_width or m.gating != "softmax" or m.routed_scaling_factor != 1.0:
    raise ValueError(f"{ARCH} export needs softmax gating, no shared experts and "
                     "routed_scaling_factor 1")
  out = hf_common.dense_config_to_hf(dataclasses.replace(c, architecture="Qwen3ForCausalLM"))
  out.update(architectures=[ARCH], model_type="qwen3_moe", num_experts=m.num_experts,
             num_experts_per_tok=m.num_experts_per_tok,
             moe_intermediate_size=m.expert_intermediate_size, norm_topk_prob=m.norm_topk_prob,
             decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=m.aux_loss_coef,
             output_router_logits=False)
  return out


def _experts_to_params(t: hf_common.TensorTaker, c: ModelConfig) -> dict:
  L, E = c.num_layers, c.moe.num_experts
  F = c.moe.expert_intermediate_size
  if "model.layers.0.mlp.experts.gate_up_proj" in t.tensors:        # fused (transformers 5)
    gate_up = t.stack("model.layers.{}.mlp.experts.gate_up_proj", L)   # [L, E, 2F, D]
    down = t.stack("model.layers.{}.mlp.experts.down_proj", L)         # [L, E, D, F]
    if gate_up is None or down is None:
      return {}
    return {"w_gate": np.swapaxes(gate_up[:, :, :F], 2, 3),
            "w_up": np.swapaxes(gate_up[:, :, F:], 2, 3), "w_down": np.swapaxes(down, 2, 3)}
  out = {}
  for ours, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
    per_layer = [t.stack(_EXPERT.format(i, "{}") + theirs + ".weight", E, lambda w: w.T)
                 for i in range(L)]
    out[ours] = None if any(a is None for a in per_layer) else np.stack(per_layer)
  return out


def to_params(tensors: dict, c: ModelConfig) -> dict:
  """Checkpoint tensors -> params (see the module docstring for the layout)."""
  t = hf_common.TensorTaker(tensors)
  params = hf_common.common_to_params(t, c)
  moe = {"router": t.stack("model.layers.{}.mlp.gate.weight", c.num_layers, lambda w: w.T)}
  moe.update(_experts_to_params(t, c))
  params["layers"]["moe"] = moe
  rest = t.finish(ARCH)
  if rest:
    raise ValueError(f"{ARCH}: unexpected tensor(s) in the checkpoint: {rest[:12]}")
  return params


def from_params(params: dict, c: ModelConfig) -> dict:
  """Params -> per-expert checkpoint tensors (the layout `save_pretrained` writes)."""
  dense = dataclasses.replace(c, architecture="Qwen3ForCausalLM")
  out = hf_common.common_from_params(params, dense)
  moe = params["layers"]["moe"]
  for i in range(c.num_layers):
    out[f"model.layers.{i}.mlp.gate.weight"] = moe["router"][i].T
    for e in range(c.moe.num_experts):
      p = _EXPERT.format(i, e)
      out[p + "gate_proj.weight"] = moe["w_gate"][i, e].T
      out[p + "up_proj.weight"] = moe["w_up"][i, e].T
      out[p + "down_proj.weight"] = moe["w_down"][i, e].T
  return out


hf_common.register_architecture(ARCH, config_from_hf, to_params, from_params, config_to_hf)

"""Hugging Face checkpoint import/export (Qwen2, Qwen3, Llama, Mistral; Qwen3-MoE registered by
models/hf/moe.py, imported here).

`load_hf_checkpoint(dir)` reads `config.json` and `*.safetensors` (single file or sharded index)
into (ModelConfig, params); `save_hf_checkpoint(dir, config, params)` writes them back in the
layout `transformers` loads. Unknown architectures and missing tensors raise errors naming them.
The tensor-name mapping shared with the MoE importer lives in `models/hf/common.py`.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models.hf import moe as moe_hf  # noqa: F401  (registers Qwen3MoeForCausalLM)
from jaxrl_sys.models.hf import safetensors_io
from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.models.hf.common import (TensorTaker, architecture, common_from_params,
                                        common_to_params, dense_config_from_hf,
                                        dense_config_to_hf, register_architecture)


def dense_to_params(tensors: dict, c: ModelConfig) -> dict:
  t = TensorTaker(tensors)
  params = common_to_params(t, c)
  L = c.num_layers
  params["layers"]["mlp"] = {
      "w_gate": t.stack("model.layers.{}.mlp.gate_proj.weight", L, lambda w: w.T),
      "w_up": t.stack("model.layers.{}.mlp.up_proj.weight", L, lambda w: w.T),
      "w_down": t.stack("model.layers.{}.mlp.down_proj.weight", L, lambda w: w.T)}
  rest = t.finish(c.architecture)
  if rest:
    raise ValueError(unexpected_tensors_message(c.architecture, rest))
  return params


def unexpected_tensors_message(arch: str, names: list[str]) -> str:
  """The error for checkpoint tensors that `arch` has no place for (they would be dropped)."""
  hint = ""
  if any(n.endswith(("q_norm.weight", "k_norm.weight")) for n in names):
    hint = (" q/k norm tensors belong to Qwen3 (config.json: \"architectures\": "
            "[\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\")")
  elif any(n.endswith(("q_proj.bias", "k_proj.bias")) for n in names):
    hint = " q/k/v biases belong to Qwen2 (or attention_bias=true in config.json)"
  return (f"{arch}: unexpected tensor(s) in the checkpoint: {names[:12]}"
          + (f" (+{len(names) - 12} more)" if len(names) > 12 else "")
          + f"; loading would drop them. config.json names {arch}, but the weights are of "
          f"another architecture?{hint}")


def dense_from_params(params: dict, c: ModelConfig) -> dict:
  out = common_from_params(params, c)
  for i in range(c.num_layers):
    m = params["layers"]["mlp"]
    out[f"model.layers.{i}.mlp.gate_proj.weight"] = m["w_gate"][i].T
    out[f"model.layers.{i}.mlp.up_proj.weight"] = m["w_up"][i].T
    out[f"model.layers.{i}.mlp.down_proj.weight"] = m["w_down"][i].T
  return out


for _a in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"):
  register_architecture(_a, lambda cfg, _n=_a: dense_config_from_hf(cfg, _n), dense_to_params,
                        dense_from_params, dense_config_to_hf)


def read_hf_config(directory: str) -> dict:
  """The parsed config.json of an HF directory; ValueError naming the file when it is not a
  JSON object."""
  path = os.path.join(directory, "config.json")
  try:
    with open(path, encoding="utf-8") as f:
      cfg = json.load(f)
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                     "rewrite it with model.config.save_pretrained(DIR)") from None
  if not isinstance(cfg, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
  return cfg


def _from_hf(config_from_hf, cfg: dict, directory: str) -> ModelConfig:
  try:
    return config_from_hf(cfg)
  except KeyError as e:
    raise ValueError(f"{os.path.join(directory, 'config.json')}: missing field {e.args[0]!r}"
                     ) from None
  except (TypeError, ValueError) as e:
    raise ValueError(f"{os.path.join(directory, 'config.json')}: {e}") from None


def _arch_of(cfg: dict, directory: str) -> str:
  archs = cfg.get("architectures") or []
  if not isinstance(archs, list) or not archs:
    raise ValueError(f"{directory}/config.json has no 'architectures' entry")
  architecture(archs[0], f"{directory}/config.json")
  return archs[0]


def load_hf_config(directory: str) -> ModelConfig:
  cfg = read_hf_config(directory)
  arch = _arch_of(cfg, directory)
  return _from_hf(architecture(arch, directory)[0], cfg, directory)


def load_hf_checkpoint(directory: str, dtype: str | None = "float32"
                       ) -> tuple[ModelConfig, dict]:
  """Loads an HF model directory into (ModelConfig, params of jnp arrays).

  Args:
    directory: holds config.json and model.safetensors (or a sharded index).
    dtype: the parameter and compute dtype: "float32" (default: float32 masters whatever the
      checkpoint holds, so small updates are not rounded away), "bfloat16", or None for the
      checkpoint's own (`load_hf_config(directory).param_dtype`, its source dtype).
  """
  cfg = read_hf_config(directory)
  arch = _arch_of(cfg, directory)
  config_from_hf, to_params, _, _ = architecture(arch, directory)
  config = _from_hf(config_from_hf, cfg, directory)
  if dtype is not None:
    config = dataclasses.replace(config, param_dtype=dtype, compute_dtype=dtype)
  tensors = safetensors_io.read_checkpoint(directory)
  params = to_params(tensors, config)
  params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, config.pdtype), params)
  return config, params


def save_hf_checkpoint(directory: str, config: ModelConfig, params: dict,
                       max_shard_bytes: int = 2 << 30, dtype: str | None = None) -> None:
  """Writes config.json + safetensors that `transformers` (and `load_hf_checkpoint`) read.

  `dtype` ("float32" / "bfloat16", or `jnp.float32` ...): the tensors' and config.json's dtype
  (None: `config.param_dtype`). Casting float32 masters to bfloat16 rounds small updates away:
  `models.hf.export.update_survival` measures how much of a training run survives it."""
  _, _, from_params, to_hf = architecture(config.architecture, "the model config (export)")
  if dtype is not None:
    config = dataclasses.replace(config, param_dtype=dtype)
  cast = lambda a: a.astype(config.pdtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
  host = jax.tree_util.tree_map(lambda a: cast(np.asarray(a)), jax.device_get(params))
  tensors = {k: np.ascontiguousarray(v) for k, v in from_params(host, config).items()}
  os.makedirs(directory, exist_ok=True)
  safetensors_io.write_checkpoint(directory, tensors, max_shard_bytes)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(to_hf(config), f, indent=2)

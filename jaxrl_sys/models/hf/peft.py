"""LoRA adapters as a PEFT adapter directory: `adapter_config.json` + `adapter_model.safetensors`.

    export_peft("out/adapter", config, lora, base_model="/path/to/base-model")

writes what `peft.PeftModel.from_pretrained(base, "out/adapter")` loads onto the Hugging Face
base model (`transformers.AutoModelForCausalLM.from_pretrained(base_model)`): one
`lora_A.weight [r, in]` / `lora_B.weight [out, r]` pair per adapted projection, named like the
base's modules, scaled by `lora_alpha / r` as `models.lora` scales them. The adapters of this
library map one to one: A `[..., in, r]` is `lora_A.weight` transposed, B `[r, ...]` is
`lora_B.weight` transposed, with the heads flattened in the order the HF export uses.

Routed-expert adapters have no PEFT module to load into (transformers 5 fuses each layer's
experts into one 3-D parameter): exporting them raises, pointing at the merged `export_hf`.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.models.hf import safetensors_io

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Our weight path -> the HF module under model.layers.{i}.
_MODULES = {("attn", "wq"): "self_attn.q_proj", ("attn", "wk"): "self_attn.k_proj",
            ("attn", "wv"): "self_attn.v_proj", ("attn", "wo"): "self_attn.o_proj",
            ("mlp", "w_gate"): "mlp.gate_proj", ("mlp", "w_up"): "mlp.up_proj",
            ("mlp", "w_down"): "mlp.down_proj"}
_PREFIX = "base_model.model.model.layers.{}."


def check_peft_targets(config: ModelConfig) -> tuple[tuple[str, ...], ...]:
  """The adapted weight paths, or ValueError when PEFT has no module for one of them."""
  paths = lora_lib.target_paths(config)
  bad = [".".join(p) for p in paths if p not in _MODULES]
  if bad:
    raise ValueError(f"--export_peft: no Hugging Face module takes the adapters of {bad} "
                     "(transformers fuses an MoE layer's experts into one parameter); export "
                     "the merged model with --export_hf, or train adapters on attention only")
  return paths


def peft_tensors(config: ModelConfig, lora: Any, dtype: str = "float32") -> dict[str, np.ndarray]:
  """The PEFT tensor names and arrays (`[r, in]` A, `[out, r]` B) of `lora`.

  Raises:
    ValueError: adapters on weights PEFT has no module for (routed or shared experts).
  """
  paths = check_peft_targets(config)
  host = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(lora))
  out = {}
  for path in paths:
    _, contract, lead = lora_lib.WEIGHTS[path]
    ab = host["layers"]
    for k in path:
      ab = ab[k]
    a, b = ab["a"], ab["b"]
    for i in range(config.num_layers):
      ai = a[i].reshape(-1, a.shape[-1])              # [in, r]
      bi = b[i].reshape(b.shape[lead], -1)            # [r, out]
      name = _PREFIX.format(i) + _MODULES[path]
      out[f"{name}.lora_A.weight"] = np.ascontiguousarray(ai.T.astype(dtype))
      out[f"{name}.lora_B.weight"] = np.ascontiguousarray(bi.T.astype(dtype))
  return out


def adapter_config(config: ModelConfig, base_model: str | None = None) -> dict:
  """The `adapter_config.json` contents for `config.lora`."""
  lc = config.lora
  modules = sorted({_MODULES[p].split(".")[-1] for p in lora_lib.target_paths(config)})
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lc.rank, "lora_alpha": lc.alpha,
          "lora_dropout": lc.dropout, "target_modules": modules, "bias": "none",
          "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
          "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
          "base_model_name_or_path": base_model, "revision": None}


def export_peft(directory: str, config: ModelConfig, lora: Any, *, base_model: str | None = None,
                overwrite: bool = False, dtype: str = "float32") -> list[str]:
  """Writes a PEFT adapter directory; returns the names of the files written.

  Args:
    directory: created; must be empty unless `overwrite`.
    config: the model config with `lora` set (its rank, alpha, targets).
    lora: the adapters (`models.lora.init_lora` layout; device or host arrays).
    base_model: recorded as `base_model_name_or_path` (the HF directory or hub id the
      adapters apply to).
    overwrite: allow a non-empty `directory`.
    dtype: the tensors' dtype ("float32" or "bfloat16").
  """
  if config.lora is None:
    raise ValueError("export_peft: the model config has no LoRA (config.lora is None)")
  directory = os.path.abspath(directory)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise ValueError(f"--export_peft={directory} is a file; give a directory")
  if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
    raise ValueError(f"--export_peft={directory} is not empty; choose a new directory or pass "
                     "--overwrite")
  tensors = peft_tensors(config, lora, dtype)
  os.makedirs(directory, exist_ok=True)
  safetensors_io.write_file(os.path.join(directory, ADAPTER_WEIGHTS), tensors,
                            metadata={"format": "pt"})
  with open(os.path.join(directory, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
    json.dump(adapter_config(config, base_model), f, indent=2)
  return sorted(os.listdir(directory))

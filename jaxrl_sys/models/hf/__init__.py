"""Hugging Face checkpoints: import and export of Qwen2 / Qwen3 / Llama / Mistral and Qwen3-MoE.

- `checkpoint`: `load_hf_checkpoint`, `load_hf_config`, `save_hf_checkpoint` (dense architectures;
  imports `moe`, which registers Qwen3-MoE).
- `common`: the architecture registry and the tensor-name mapping shared by the importers.
- `export`: `export_hf`, a trained policy as a directory `transformers` loads (with tokenizers);
  `update_survival`, how much of a training run a cast to the export dtype keeps.
- `safetensors_io`: the numpy safetensors reader / writer (bf16 via ml_dtypes, sharded indexes).
"""
from jaxrl_sys.models.hf.checkpoint import load_hf_checkpoint, load_hf_config, save_hf_checkpoint
from jaxrl_sys.models.hf.export import UpdateSurvival, export_hf, update_survival

__all__ = ["UpdateSurvival", "export_hf", "load_hf_checkpoint", "load_hf_config",
           "save_hf_checkpoint", "update_survival"]

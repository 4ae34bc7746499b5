"""A trained policy as a Hugging Face model directory: safetensors + config.json + tokenizer.

    export_hf("out/hf", config, params, tokenizer_dir="/path/to/base-model")

writes what `transformers.AutoModelForCausalLM.from_pretrained("out/hf")` and
`AutoTokenizer.from_pretrained("out/hf")` load: the weights and config through
`save_hf_checkpoint`, and the tokenizer files copied from the model the run started from (or
given as text, e.g. `tasks.CharTokenizer.hf_tokenizer_files()` for the tiny presets).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Mapping

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.models.hf.checkpoint import save_hf_checkpoint

# Files of an HF model directory that describe the tokenizer and generation defaults.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "generation_config.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def export_hf(directory: str, config: ModelConfig, params: Any, *,
              tokenizer_dir: str | None = None,
              tokenizer_files: Mapping[str, str] | None = None,
              overwrite: bool = False, dtype: str | None = None) -> list[str]:
  """Writes an HF model directory and returns the names of the files written.

  Args:
    directory: the export directory (created; must be empty unless `overwrite`).
    config: the model config (its `architecture` picks the HF layout).
    params: the parameters (device or host arrays).
    tokenizer_dir: a directory whose tokenizer files (TOKENIZER_FILES) are copied.
    tokenizer_files: file name -> text, written after the copies.
    overwrite: allow a non-empty `directory` (files of the same names are replaced).
    dtype: the exported tensors' dtype ("float32" / "bfloat16"; None: `config.param_dtype`).

  Raises:
    ValueError: `directory` is a file, or non-empty without `overwrite`; unsupported
      architecture.
  """
  directory = os.path.abspath(directory)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise ValueError(f"--export_hf={directory} is a file; give a directory")
  if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
    raise ValueError(f"--export_hf={directory} is not empty; choose a new directory or pass "
                     "--overwrite")
  save_hf_checkpoint(directory, config, params, dtype=dtype)
  if tokenizer_dir is not None:
    for name in TOKENIZER_FILES:
      src = os.path.join(tokenizer_dir, name)
      if os.path.isfile(src):
        shutil.copyfile(src, os.path.join(directory, name))
  for name, text in (tokenizer_files or {}).items():
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.write(text)
  return sorted(os.listdir(directory))

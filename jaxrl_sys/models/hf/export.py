"""A trained policy as a Hugging Face model directory: safetensors + config.json + tokenizer.

    export_hf("out/hf", config, params, tokenizer_dir="/path/to/base-model")

writes what `transformers.AutoModelForCausalLM.from_pretrained("out/hf")` and
`AutoTokenizer.from_pretrained("out/hf")` load: the weights and config through
`save_hf_checkpoint`, and the tokenizer files copied from the model the run started from (or
given as text, e.g. `tasks.CharTokenizer.hf_tokenizer_files()` for the tiny presets).

Exporting float32 masters in a narrower dtype rounds every parameter to that dtype's grid, and
an RL update is usually far below a bfloat16 step (about 0.4% of the value): most of it rounds
back to the starting weights. `update_survival(initial, trained, dtype)` counts how much of a
training run survives a cast; `experiments.grpo --export_hf` reports it and defaults to float32,
which keeps everything.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np

from jaxrl_sys.models.config import ModelConfig, dtype_name
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


class UpdateSurvival(NamedTuple):
  """How much of a training run a cast keeps.

  Attributes:
    dtype: the dtype cast to (a name, e.g. "bfloat16").
    changed: parameters (scalars) the training changed, compared in float32.
    kept: of those, the ones that still differ from the start after both are cast.
    total: all parameters.
  """
  dtype: str
  changed: int
  kept: int
  total: int

  @property
  def fraction(self) -> float:
    """kept / changed (1.0 when the training changed nothing)."""
    return self.kept / self.changed if self.changed else 1.0

  def describe(self) -> str:
    """One line: what the cast keeps, and what to do when it loses most of it."""
    head = (f"{self.dtype} export keeps the update of {self.kept:,} of the {self.changed:,} "
            f"parameters training changed ({100 * self.fraction:.1f}%; {self.total:,} in all)")
    if self.fraction >= KEEP_WARN_FRACTION:
      return head
    return (f"WARNING: {head}: the rest rounds back to the starting weights, so the exported "
            "model is mostly the untrained one; export with --export_dtype=float32 (or "
            "dtype='float32'), or cast only after more training")


# Below this share of the changed parameters kept, the survival line becomes a warning.
KEEP_WARN_FRACTION = 0.9


def update_survival(initial: Any, trained: Any, dtype: Any) -> UpdateSurvival:
  """Counts the parameters whose training update survives a cast to `dtype`.

  Args:
    initial: the parameters training started from (pytree of arrays, e.g. float32 masters of a
      bfloat16 checkpoint: their cast is the checkpoint itself).
    trained: the trained parameters, same structure.
    dtype: the export dtype ("float32", "bfloat16", `jnp.bfloat16`, ...).

  Returns:
    `UpdateSurvival` (floating leaves only; others are not counted).
  """
  name = dtype_name(dtype)
  target = np.dtype(jax.numpy.dtype(name))
  changed = kept = total = 0
  for a, b in zip(jax.tree.leaves(jax.device_get(initial)), jax.tree.leaves(
      jax.device_get(trained))):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind not in "fV" or a.shape != b.shape:
      continue
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    moved = a32 != b32
    total += a.size
    changed += int(moved.sum())
    kept += int((moved & (a32.astype(target) != b32.astype(target))).sum())
  return UpdateSurvival(name, changed, kept, total)

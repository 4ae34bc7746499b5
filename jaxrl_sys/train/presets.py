"""Model presets (tiny dense, tiny MoE, or a local Hugging Face directory) and the tokenizer
that goes with each."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from jaxrl_sys.models import MoEConfig, ModelConfig
from jaxrl_sys.tasks import CharTokenizer

MODEL_PRESETS = ("tiny", "tiny_moe")
# The synthetic tasks' alphabet (arithmetic, countdown). A small vocabulary matters for RL on a
# tiny model: negative advantages push probability onto the other tokens, and with a large
# vocabulary most of those are junk the task never uses.
MATH_CHARS = "0123456789+-*/=():, "


def tiny_config(vocab_size: int, max_seq_len: int = 32, moe: bool = False) -> ModelConfig:
  """A ~0.1M-parameter model that trains in seconds on one CPU core."""
  moe_cfg = None
  if moe:
    moe_cfg = MoEConfig(num_experts=4, num_experts_per_tok=2, expert_intermediate_size=64,
                        balancing="aux_free")
  return ModelConfig(vocab_size=vocab_size, hidden_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=16, intermediate_size=128,
                     max_seq_len=max_seq_len, moe=moe_cfg, tie_embeddings=False)


class HFTaskTokenizer:
  """Adapts `models.HFTokenizer` to the task tokenizer interface (`encode(text, bos, eos)`,
  `decode`, `pad_id`, `bos_id`, `eos_id`, `vocab_size`)."""

  def __init__(self, directory: str, bos_id: int | None = None):
    from jaxrl_sys.models import HFTokenizer  # pylint: disable=import-outside-toplevel
    self._tok = HFTokenizer(directory)
    if not self._tok.eos_token_ids:
      raise ValueError(f"{directory}: the tokenizer names no eos token")
    self.eos_id = self._tok.eos_token_ids[0]
    self.pad_id = self._tok.pad_token_id
    self.bos_id = bos_id
    self.vocab_size = self._tok.vocab_size

  def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
    ids = self._tok.encode(text)
    if bos and self.bos_id is not None:
      ids = [self.bos_id] + ids
    return ids + ([self.eos_id] if eos else [])

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._tok.decode(ids)


@dataclasses.dataclass
class LoadedModel:
  """config, tokenizer, and params (None = initialise randomly from the seed)."""
  config: ModelConfig
  tokenizer: Any
  params: Any = None


def load_model(name: str, *, max_seq_len: int = 32) -> LoadedModel:
  """A preset by name ("tiny", "tiny_moe") or a local HF directory (config.json,
  model.safetensors, tokenizer.json).

  Raises:
    ValueError: for an unknown preset that is not a directory.
  """
  if name in MODEL_PRESETS:
    tok = CharTokenizer(MATH_CHARS)
    return LoadedModel(tiny_config(tok.vocab_size, max_seq_len, moe=name == "tiny_moe"), tok)
  if os.path.isdir(name):
    from jaxrl_sys.models import load_hf_checkpoint  # pylint: disable=import-outside-toplevel
    config, params = load_hf_checkpoint(name)
    return LoadedModel(config, HFTaskTokenizer(name, config.bos_token_id), params)
  raise ValueError(f"unknown model {name!r}: use a preset {MODEL_PRESETS} or a local Hugging "
                   "Face model directory")

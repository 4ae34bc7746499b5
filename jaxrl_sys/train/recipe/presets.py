"""Model presets (tiny dense, tiny MoE, or a local Hugging Face directory) and the tokenizer
that goes with each.

A Hugging Face directory needs config.json, safetensors weights and tokenizer.json; a missing
piece is reported with the command that writes it. Its chat template, when it has one, wraps
every prompt as one user turn followed by the generation prompt (`chat_template=False` feeds
the raw prompt text).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from jaxrl_sys.models import HFTokenizer, MoEConfig, ModelConfig
from jaxrl_sys.tasks import CharTokenizer, Tokenizer

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


@dataclasses.dataclass
class LoadedModel:
  """config, tokenizer, and params (None = initialise randomly from the seed); `hf_dir`: the
  Hugging Face directory it came from (None for a preset); `source_dtype`: the dtype its
  checkpoint stores ("bfloat16" for most real models; "float32" for a preset), what
  `--export_hf` writes by default. `params` are float32 masters whatever the source dtype."""
  config: ModelConfig
  tokenizer: Tokenizer
  params: Any = None
  hf_dir: str | None = None
  source_dtype: str = "float32"

  @property
  def is_preset(self) -> bool:
    return self.hf_dir is None


def check_hf_directory(directory: str) -> None:
  """Raises ValueError listing what an HF model directory lacks, and how to write it."""
  problems = []
  has = lambda n: os.path.exists(os.path.join(directory, n))  # noqa: E731
  if not has("config.json"):
    problems.append("config.json is missing (model.config.save_pretrained(DIR) writes it)")
  files = os.listdir(directory)
  if not any(f.endswith(".safetensors") for f in files):
    legacy = [f for f in files if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    problems.append(
        "no *.safetensors weights" + (f" (found {legacy[:3]}: PyTorch pickles are not read)"
                                      if legacy else "")
        + "; write them with model.save_pretrained(DIR, safe_serialization=True)")
  if not has("tokenizer.json"):
    hint = " (tokenizer.model, a slow tokenizer, is not read)" if has("tokenizer.model") else ""
    problems.append(f"tokenizer.json is missing{hint}; write it with "
                    "transformers.AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)")
  if problems:
    raise ValueError(f"model directory {directory} is not a usable Hugging Face model:\n  "
                     + "\n  ".join(problems))


def load_model(name: str, *, max_seq_len: int = 32, chat_template: bool = True,
               extra_chars: str = "") -> LoadedModel:
  """A preset by name ("tiny", "tiny_moe") or a local HF directory (config.json,
  *.safetensors, tokenizer.json).

  Args:
    name: preset name or directory.
    max_seq_len: context of a preset model.
    chat_template: apply an HF tokenizer's chat template to prompts (see `models.HFTokenizer`).
    extra_chars: characters a preset's tokenizer must know beyond MATH_CHARS (the text of a
      user's data set).

  Raises:
    ValueError: an unknown preset that is not a directory, or a directory that lacks files.
  """
  if name in MODEL_PRESETS:
    extra = "".join(sorted(set(extra_chars) - set(MATH_CHARS)))
    tok = CharTokenizer(MATH_CHARS + extra)
    return LoadedModel(tiny_config(tok.vocab_size, max_seq_len, moe=name == "tiny_moe"), tok)
  if os.path.isdir(name):
    # pylint: disable-next=import-outside-toplevel
    from jaxrl_sys.models import load_hf_checkpoint, load_hf_config
    check_hf_directory(name)
    config, params = load_hf_checkpoint(name, "float32")
    tok = HFTokenizer(name, config.bos_token_id, chat_template=chat_template)
    return LoadedModel(config, tok, params, hf_dir=os.path.abspath(name),
                       source_dtype=load_hf_config(name).param_dtype)
  if os.path.exists(name):
    raise ValueError(f"--model={name} is a file; give a preset {MODEL_PRESETS} or a Hugging "
                     "Face model directory")
  raise ValueError(f"unknown model {name!r}: use a preset {MODEL_PRESETS} or a local Hugging "
                   "Face model directory")

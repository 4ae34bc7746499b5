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
  `decode`, `pad_id`, `bos_id`, `eos_id`, `vocab_size`).

  Prompts are what the loop encodes with `bos=True`: with `chat_template` on and a template in
  the directory, such a text is rendered as one user message plus the generation prompt (the
  template places its own bos token); otherwise bos (if the model has one) + the text.
  """

  def __init__(self, directory: str, bos_id: int | None = None, chat_template: bool = True):
    from jaxrl_sys.models import HFTokenizer  # pylint: disable=import-outside-toplevel
    self._tok = HFTokenizer(directory)
    if not self._tok.eos_token_ids:
      raise ValueError(f"{directory}: the tokenizer names no eos token (set eos_token_id in "
                       "config.json or generation_config.json)")
    self.eos_id = self._tok.eos_token_ids[0]
    self.pad_id = self._tok.pad_token_id
    self.bos_id = bos_id
    self.vocab_size = self._tok.vocab_size
    self.uses_chat_template = bool(chat_template and self._tok.chat_template)

  def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
    if bos and self.uses_chat_template:
      ids = self._tok.encode(self._tok.apply_chat_template([{"role": "user", "content": text}]))
    else:
      ids = self._tok.encode(text)
      if bos and self.bos_id is not None:
        ids = [self.bos_id] + ids
    return ids + ([self.eos_id] if eos else [])

  def unknown_characters(self, text: str) -> str:
    """See `models.HFTokenizer.unknown_characters`."""
    return self._tok.unknown_characters(text)

  @property
  def unk_token(self) -> str | None:
    return self._tok.unk_token

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._tok.decode(ids)


@dataclasses.dataclass
class LoadedModel:
  """config, tokenizer, and params (None = initialise randomly from the seed); `hf_dir`: the
  Hugging Face directory it came from (None for a preset); `source_dtype`: the dtype its
  checkpoint stores ("bfloat16" for most real models; "float32" for a preset), what
  `--export_hf` writes by default. `params` are float32 masters whatever the source dtype."""
  config: ModelConfig
  tokenizer: Any
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
    chat_template: apply an HF tokenizer's chat template to prompts (see `HFTaskTokenizer`).
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
    tok = HFTaskTokenizer(name, config.bos_token_id, chat_template=chat_template)
    return LoadedModel(config, tok, params, hf_dir=os.path.abspath(name),
                       source_dtype=load_hf_config(name).param_dtype)
  if os.path.exists(name):
    raise ValueError(f"--model={name} is a file; give a preset {MODEL_PRESETS} or a Hugging "
                     "Face model directory")
  raise ValueError(f"unknown model {name!r}: use a preset {MODEL_PRESETS} or a local Hugging "
                   "Face model directory")

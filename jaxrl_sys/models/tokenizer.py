"""Tokenizer of an HF model directory (`tokenizer.json` through the `tokenizers` package)."""
from __future__ import annotations

import json
import os
from typing import Sequence


class HFTokenizer:
  """Wraps `tokenizers.Tokenizer` with the special ids of the model directory.

  Attributes: `eos_token_ids` (tuple, from generation_config.json / config.json /
  tokenizer_config.json), `pad_token_id`, `vocab_size`.
  """

  def __init__(self, directory: str):
    import tokenizers  # pylint: disable=import-outside-toplevel
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"no tokenizer.json in {directory}")
    self._tok = tokenizers.Tokenizer.from_file(path)
    meta: dict = {}
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
      p = os.path.join(directory, name)
      if os.path.exists(p):
        with open(p) as f:
          meta.update({k: v for k, v in json.load(f).items() if v is not None})
    eos = meta.get("eos_token_id")
    if eos is None and isinstance(meta.get("eos_token"), str):
      eos = self._tok.token_to_id(meta["eos_token"])
    self.eos_token_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else (
        () if eos is None else (int(eos),))
    pad = meta.get("pad_token_id")
    if pad is None and isinstance(meta.get("pad_token"), str):
      pad = self._tok.token_to_id(meta["pad_token"])
    self.pad_token_id: int = int(pad) if pad is not None else (self.eos_token_ids or (0,))[0]
    self.vocab_size: int = self._tok.get_vocab_size()

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

"""Character-level tokenizer for the synthetic tasks (no files, no hub)."""
from __future__ import annotations

from typing import Sequence

_CHARS = "0123456789+-*/=()?,.:; abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ#\n"


class CharTokenizer:
  """Maps characters to ids: 0 = pad, 1 = bos, 2 = eos, then one id per known character.

  `encode` rejects unknown characters with a ValueError naming them.
  """
  pad_id = 0
  bos_id = 1
  eos_id = 2

  def __init__(self, chars: str = _CHARS):
    if len(set(chars)) != len(chars):
      raise ValueError("CharTokenizer: duplicate characters in the alphabet")
    self._chars = chars
    self._ids = {c: i + 3 for i, c in enumerate(chars)}
    self.vocab_size = len(chars) + 3

  def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
    bad = sorted({c for c in text if c not in self._ids})
    if bad:
      raise ValueError(f"CharTokenizer: characters not in the alphabet: {bad!r}")
    ids = [self._ids[c] for c in text]
    return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

  def decode(self, ids: Sequence[int], stop_at_eos: bool = True) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id and stop_at_eos:
        break
      if i >= 3 and i - 3 < len(self._chars):
        out.append(self._chars[i - 3])
    return "".join(out)

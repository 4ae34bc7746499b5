"""Character-level tokenizer for the synthetic tasks (no files, no hub)."""
from __future__ import annotations

from typing import Sequence

_CHARS = "0123456789+-*/=()?,.:; abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ#\n"


class CharTokenizer:
  """Maps characters to ids: 0 = pad, 1 = bos, 2 = eos, then one id per known character.

  Implements `tasks.Tokenizer`; `encode` rejects unknown characters with a ValueError naming
  them.
  """
  pad_id = 0
  bos_id = 1
  eos_id = 2
  uses_chat_template = False

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

  def unknown_characters(self, text: str) -> str:
    """The distinct characters of `text` (in order) outside the alphabet."""
    return "".join(dict.fromkeys(c for c in text if c not in self._ids))

  @property
  def alphabet(self) -> str:
    """The characters, in id order (id = position + 3)."""
    return self._chars

  def hf_tokenizer_files(self) -> dict[str, str]:
    """`tokenizer.json` and `tokenizer_config.json` contents of the same mapping, for an HF
    export: `transformers.AutoTokenizer` then encodes a text to the same ids (one word-level
    token per character; "<pad>", "<s>", "</s>" are ids 0, 1, 2)."""
    import json  # pylint: disable=import-outside-toplevel

    import tokenizers  # pylint: disable=import-outside-toplevel
    from tokenizers import decoders, models, pre_tokenizers  # pylint: disable=import-outside-toplevel
    specials = ["<pad>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)}
    vocab.update(self._ids)
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                            for t in specials])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
              "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False,
              "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tok.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(config, indent=2)}

  def decode(self, ids: Sequence[int], stop_at_eos: bool = True) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id and stop_at_eos:
        break
      if i >= 3 and i - 3 < len(self._chars):
        out.append(self._chars[i - 3])
    return "".join(out)

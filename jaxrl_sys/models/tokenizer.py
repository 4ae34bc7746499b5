"""Tokenizer of an HF model directory (`tokenizer.json` through the `tokenizers` package) and
its chat template (`tokenizer_config.json["chat_template"]` or `chat_template.jinja`, rendered
with jinja2 in a sandbox), implementing the `tasks.Tokenizer` protocol."""
from __future__ import annotations

import json
import os
import time
from typing import Sequence


class HFTokenizer:
  """The tokenizer of a Hugging Face model directory, as a `tasks.Tokenizer`.

  Prompts are what the loop encodes with `bos=True`: with `chat_template` on and a template in
  the directory, such a text is rendered as one user message plus the generation prompt (the
  template places its own bos token); otherwise bos (if the model has one) + the text.
  `decode` stops at the first eos and drops special tokens.

  Args:
    directory: the model directory (tokenizer.json; special ids from generation_config.json,
      config.json, tokenizer_config.json).
    bos_id: the model's bos id (config.json's `bos_token_id`), or None when it has none.
    chat_template: wrap prompts in the directory's chat template when it has one.

  Attributes: `pad_id`, `bos_id`, `eos_id`, `vocab_size`, `uses_chat_template` (the
  `tasks.Tokenizer` protocol); `eos_token_ids` (every eos id the directory names),
  `chat_template` (jinja source or None), `special_tokens` (bos / eos texts).

  Raises:
    FileNotFoundError: no tokenizer.json. ValueError: an unreadable file, or no eos token.
  """

  def __init__(self, directory: str, bos_id: int | None = None, chat_template: bool = True):
    import tokenizers  # pylint: disable=import-outside-toplevel
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"no tokenizer.json in {directory}")
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # pylint: disable=broad-except  (the Rust error names no file)
      raise ValueError(f"{path}: not a readable tokenizer ({e})") from None
    meta: dict = {}
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
      p = os.path.join(directory, name)
      if os.path.exists(p):
        try:
          with open(p, encoding="utf-8") as f:
            data = json.load(f)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
          raise ValueError(f"{p}: not valid JSON ({e})") from None
        if not isinstance(data, dict):
          raise ValueError(f"{p}: expected a JSON object, got {type(data).__name__}")
        meta.update({k: v for k, v in data.items() if v is not None})
    self.chat_template = _chat_template(directory, meta.get("chat_template"))
    self.special_tokens = {k: _token_text(meta.get(k)) for k in ("bos_token", "eos_token")}
    eos = meta.get("eos_token_id")
    if eos is None and isinstance(meta.get("eos_token"), str):
      eos = self._tok.token_to_id(meta["eos_token"])
    self.eos_token_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else (
        () if eos is None else (int(eos),))
    if not self.eos_token_ids:
      raise ValueError(f"{directory}: the tokenizer names no eos token (set eos_token_id in "
                       "config.json or generation_config.json)")
    pad = meta.get("pad_token_id")
    if pad is None and isinstance(meta.get("pad_token"), str):
      pad = self._tok.token_to_id(meta["pad_token"])
    self.eos_id: int = self.eos_token_ids[0]
    self.pad_id: int = int(pad) if pad is not None else self.eos_id
    self.bos_id = bos_id
    self.vocab_size: int = self._tok.get_vocab_size()
    self.uses_chat_template = bool(chat_template and self.chat_template)

  def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
    """Token ids of `text`: a prompt (`bos=True`) in the chat template or after bos, then eos
    when asked."""
    if bos and self.uses_chat_template:
      content = self.apply_chat_template([{"role": "user", "content": text}])
      ids = self._tok.encode(content, add_special_tokens=False).ids
    else:
      ids = self._tok.encode(text, add_special_tokens=False).ids
      if bos and self.bos_id is not None:
        ids = [self.bos_id] + ids
    return ids + ([self.eos_id] if eos else [])

  def decode(self, ids: Sequence[int], *, stop_at_eos: bool = True,
             skip_special_tokens: bool = True) -> str:
    """The text of `ids` up to the first eos, special tokens dropped (or, with the flags off,
    every token as it is: the turn formats of multi-turn episodes read template tokens)."""
    ids = [int(i) for i in ids]
    if stop_at_eos and self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

  @property
  def unk_token(self) -> str | None:
    """The token unknown text becomes (None for byte-level tokenizers, which know every text)."""
    token = getattr(self._tok.model, "unk_token", None)
    return token if token and self._tok.token_to_id(token) is not None else None

  def unknown_characters(self, text: str) -> str:
    """The distinct pieces of `text` (in order) that the tokenizer maps to its unknown token:
    text the model cannot see ("" for a byte-level tokenizer)."""
    unk = self.unk_token
    if unk is None:
      return ""
    unk_id = self._tok.token_to_id(unk)
    enc = self._tok.encode(text, add_special_tokens=False)
    out = []
    for i, (a, b) in zip(enc.ids, enc.offsets):
      piece = text[a:b]
      if i == unk_id and piece != unk and piece not in out:
        out.append(piece)
    return "".join(out)

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The chat template rendered for `messages` ([{"role": ..., "content": ...}]).

    Raises:
      ValueError: there is no chat template, or rendering it failed (the template's message).
    """
    if self.chat_template is None:
      raise ValueError("this tokenizer has no chat template")
    import jinja2  # pylint: disable=import-outside-toplevel
    from jinja2 import sandbox  # pylint: disable=import-outside-toplevel

    def raise_exception(message):
      raise jinja2.TemplateError(message)

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent,
                                                                    ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: time.strftime(fmt))
    try:
      return env.from_string(self.chat_template).render(
          messages=messages, add_generation_prompt=add_generation_prompt,
          bos_token=self.special_tokens["bos_token"] or "",
          eos_token=self.special_tokens["eos_token"] or "")
    except jinja2.TemplateError as e:
      raise ValueError(f"the chat template failed to render: {e}") from e


def _token_text(value) -> str | None:
  """A special token's text from tokenizer_config.json (a string or an AddedToken dict)."""
  if isinstance(value, dict):
    return value.get("content")
  return value if isinstance(value, str) else None


def _chat_template(directory: str, configured) -> str | None:
  """The default chat template: chat_template.jinja, else tokenizer_config.json's entry (a
  string, or a list of {"name", "template"} from which "default" is taken)."""
  path = os.path.join(directory, "chat_template.jinja")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  if isinstance(configured, list):
    named = {t.get("name"): t.get("template") for t in configured if isinstance(t, dict)}
    return named.get("default")
  return configured if isinstance(configured, str) else None

"""Turn formats: the token ids around the policy's turns and the environment's observations.

An episode's training sequence is built from token ids only: the prompt ids, then for each turn
the ids the engine sampled, the template glue that closes the turn, and the ids of the
observation turn (tool results) that opens the next one. No text is ever re-tokenized across a
turn boundary, so the sequence the trainer scores is the one the policy produced.

- `PlainFormat(tokenizer)`: a tokenizer without a chat template (the character-level tasks):
  turns end with eos; an observation is `obs_prefix + text + obs_suffix`.
- `ChatTemplateFormat(hf_tokenizer)`: the glue is derived once from the tokenizer's chat
  template by rendering a few conversations with placeholder contents and diffing them (what
  follows an assistant message, what wraps one and two tool results, the generation prompt).
  `check()` renders a sample tool conversation two ways, as one `apply_chat_template` and as
  the concatenation of the pieces an episode is built from, and raises `TemplateMismatchError`
  naming the first token where they differ (a template that is not append-only: a separator
  dropped at the assistant -> tool boundary, earlier turns re-rendered, ...).

Both formats answer the same questions (`TurnFormat`): the prompt ids of a first observation,
the stop ids that end a turn, the glue after a turn (the closing token itself when the policy
ran out of budget), the ids of an observation turn, and the action text of sampled ids.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence


class TemplateMismatchError(ValueError):
  """A chat template renders a conversation differently from the turn-by-turn concatenation
  an episode is built from (the template is not append-only)."""


class TurnFormat(Protocol):
  """What the episode driver needs to know about turns (token ids only)."""
  stop_ids: tuple[int, ...]

  def prompt(self, text: str) -> list[int]: ...

  def encode(self, text: str) -> list[int]: ...

  def close_turn(self, sampled: Sequence[int]) -> list[int]: ...

  def observation(self, texts: Sequence[str]) -> list[int]: ...

  def action_text(self, sampled: Sequence[int]) -> str: ...


class PlainFormat:
  """Turns of a tokenizer without a chat template (`encode(text, bos=, eos=)`, `decode`,
  `eos_id`): the prompt is bos + text, a turn ends with eos, an observation turn is the text
  of `obs_prefix + "\\n".join(texts) + obs_suffix`."""

  def __init__(self, tokenizer, obs_prefix: str = "\n", obs_suffix: str = "\n"):
    self.tok, self.obs_prefix, self.obs_suffix = tokenizer, obs_prefix, obs_suffix
    self.stop_ids = (int(tokenizer.eos_id),)

  def prompt(self, text: str) -> list[int]:
    return list(self.tok.encode(text, bos=True))

  def encode(self, text: str) -> list[int]:
    """The ids of `text` inside a turn (no bos, no eos)."""
    return list(self.tok.encode(text))

  def close_turn(self, sampled: Sequence[int]) -> list[int]:
    """Nothing after a turn that ended on eos; eos itself (template glue) otherwise."""
    return [] if len(sampled) and int(sampled[-1]) in self.stop_ids else [self.stop_ids[0]]

  def observation(self, texts: Sequence[str]) -> list[int]:
    """The observation turn's ids; characters the tokenizer cannot encode (a character-level
    alphabet) become "?" (or are dropped when "?" is unknown too)."""
    text = self.obs_prefix + "\n".join(texts) + self.obs_suffix
    known = getattr(self.tok, "alphabet", None)
    if known is not None:
      fill = "?" if "?" in known else ""
      text = "".join(c if c in known else fill for c in text)
    return list(self.tok.encode(text))

  def action_text(self, sampled: Sequence[int]) -> str:
    ids = [int(i) for i in sampled]
    while ids and ids[-1] in self.stop_ids:
      ids.pop()
    return self.tok.decode(ids)


_A, _B, _T, _U = "ZqAssistantBodyZq", "ZqSecondBodyZq", "ZqToolResultZq", "ZqUserQueryZq"


def _split(text: str, marker: str, what: str) -> tuple[str, str]:
  i = text.find(marker)
  if i < 0:
    raise TemplateMismatchError(f"the chat template drops the {what}'s content (rendered: "
                                f"{text[-200:]!r}); episodes need it rendered verbatim")
  return text[:i], text[i + len(marker):]


class ChatTemplateFormat:
  """Turn glue derived from an HF tokenizer's chat template (see the module docstring).

  Args:
    tokenizer: a `models.HFTokenizer` (or anything with `encode(text)`, `decode(ids,
      stop_at_eos=, skip_special_tokens=)`, `apply_chat_template(messages,
      add_generation_prompt=)` and `eos_token_ids`).
    tool_role: the role of observation messages ("tool"; some templates use "user").
    system: a system message placed before the first user message (None: none).
  """

  def __init__(self, tokenizer: Any, tool_role: str = "tool", system: str | None = None):
    self.tok = tokenizer
    self.tool_role = tool_role
    self._head = [{"role": "system", "content": system}] if system is not None else []
    self._derive()

  # ----- derivation ----------------------------------------------------------------------------
  def _render(self, messages: list[dict], gen: bool) -> str:
    return self.tok.apply_chat_template(self._head + messages, add_generation_prompt=gen)

  def _derive(self) -> None:
    user = [{"role": "user", "content": _U}]
    asst = {"role": "assistant", "content": _A}
    tool = lambda t: {"role": self.tool_role, "content": t}  # noqa: E731
    p0 = self._render(user, True)
    plain = self._render(user, False)
    if not p0.startswith(plain):
      raise TemplateMismatchError("the chat template's generation prompt is not appended to the "
                                  "conversation it continues")
    self.generation_prompt = p0[len(plain):]
    p1 = self._render(user + [asst, tool(_T)], True)
    if not p1.startswith(p0):
      raise TemplateMismatchError(
          f"the chat template renders the prompt differently once the assistant answered: "
          f"{_first_text_diff(p0, p1)}")
    lead, rest = _split(p1[len(p0):], _A, "assistant message")
    if lead:
      raise TemplateMismatchError(f"the chat template puts {lead!r} before an assistant message "
                                  "that the generation prompt does not end with")
    mid, after = _split(rest, _T, "tool message")
    last = self._render(user + [asst], False)
    close = _split(last[len(p0):], _A, "assistant message")[1]
    ids = self.tok.encode(close)
    if not ids:
      raise TemplateMismatchError("the chat template closes an assistant turn with nothing: "
                                  "no end-of-turn token to stop on")
    stop = self._text(ids[:1])
    if not mid.startswith(stop):
      raise TemplateMismatchError(f"the chat template ends an assistant turn followed by a tool "
                                  f"result without its end-of-turn token {stop!r}")
    # Episodes close a turn with the glue of a last turn (`close`); a template whose glue
    # depends on what follows is caught by `check()`, which names the first differing token.
    self.turn_close = close
    self.obs_open = mid[len(close):] if mid.startswith(close) else mid[len(stop):]
    two = self._render(user + [asst, tool(_T), tool(_B)], True)
    between, self.obs_close = _split(_split(two, _T, "tool message")[1], _B, "second tool message")
    self.obs_between = between
    if after != self.obs_close:
      raise TemplateMismatchError("the chat template renders one tool result differently from "
                                  "the first of two")
    eos = tuple(int(i) for i in getattr(self.tok, "eos_token_ids", ()))
    self.stop_ids = tuple(dict.fromkeys([int(ids[0])] + list(eos)))
    self.glue_ids = [int(i) for i in ids[1:]]

  # ----- the format ----------------------------------------------------------------------------
  def prompt(self, text: str) -> list[int]:
    return list(self.tok.encode(self._render([{"role": "user", "content": text}], True)))

  def encode(self, text: str) -> list[int]:
    """The ids of `text` inside a turn."""
    return list(self.tok.encode(text))

  def close_turn(self, sampled: Sequence[int]) -> list[int]:
    """The glue after the turn's stop token, preceded by the stop token when the policy did not
    sample one (budget exhausted)."""
    ended = len(sampled) and int(sampled[-1]) in self.stop_ids
    return ([] if ended else [self.stop_ids[0]]) + list(self.glue_ids)

  def observation(self, texts: Sequence[str]) -> list[int]:
    text = self.obs_open + self.obs_between.join(texts) + self.obs_close
    return list(self.tok.encode(text))

  def action_text(self, sampled: Sequence[int]) -> str:
    ids = [int(i) for i in sampled]
    while ids and ids[-1] in self.stop_ids:
      ids.pop()
    return self._text(ids)

  def _text(self, ids: Sequence[int]) -> str:
    return self.tok.decode(list(ids), stop_at_eos=False, skip_special_tokens=False)

  # ----- the self-check ------------------------------------------------------------------------
  def check(self, conversation: Sequence[dict] | None = None) -> None:
    """Renders a tool conversation (user, then assistant and tool messages, a final assistant
    message; default: a sample one) as one chat-template render and as the concatenation of
    the episode pieces; raises `TemplateMismatchError` at the first differing token."""
    conv = list(conversation or SAMPLE_CONVERSATION)
    if not conv or conv[0]["role"] != "user":
      raise ValueError("the conversation must start with a user message")
    full = list(self.tok.encode(self._render(conv, False)))
    pieces = self.prompt(conv[0]["content"])
    i = 1
    while i < len(conv):
      m = conv[i]
      if m["role"] == "assistant":
        pieces += list(self.tok.encode(m["content"])) + [self.stop_ids[0]] + self.glue_ids
        i += 1
      else:
        texts = []
        while i < len(conv) and conv[i]["role"] != "assistant":
          texts.append(conv[i]["content"])
          i += 1
        pieces += self.observation(texts)
    diff = first_difference(full, pieces)
    if diff is not None:
      raise TemplateMismatchError(
          f"chat template self-check failed: the conversation rendered at once and built turn "
          f"by turn differ at token {diff}: {self._describe(full, diff)} (one render) vs "
          f"{self._describe(pieces, diff)} (turn by turn); context {self._context(full, diff)}. "
          "The template is not append-only for tool conversations (e.g. a separator dropped "
          "at the assistant -> tool boundary, or earlier turns re-rendered): fix the template "
          "(tokenizer_config.json chat_template) or pass another one")

  def _describe(self, ids: list[int], i: int) -> str:
    if i >= len(ids):
      return "<end of sequence>"
    return f"id {ids[i]} {self._text([ids[i]])!r}"

  def _context(self, ids: list[int], i: int) -> str:
    return repr(self._text(ids[max(i - 8, 0):i]))


SAMPLE_CONVERSATION = (
    {"role": "user", "content": "What is 12 * 7 + 5? Use the calculator."},
    {"role": "assistant", "content": '<think>\nI need the calculator.\n</think>\n\n'
                                     '<tool_call>\n{"name": "calc", "arguments": '
                                     '{"expression": "12*7"}}\n</tool_call>'},
    {"role": "tool", "content": "84"},
    {"role": "assistant", "content": '<think>\nNow add 5.\n</think>\n\n<tool_call>\n'
                                     '{"name": "calc", "arguments": {"expression": "84+5"}}'
                                     '\n</tool_call>\n<tool_call>\n'
                                     '{"name": "calc", "arguments": {"expression": "1+1"}}\n'
                                     '</tool_call>'},
    {"role": "tool", "content": "89"},
    {"role": "tool", "content": "2"},
    {"role": "assistant", "content": "<think>\nIt is 89.\n</think>\n\nThe answer is 89."},
)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
  """The first index where `a` and `b` differ (a length difference counts), or None."""
  for i, (x, y) in enumerate(zip(a, b)):
    if int(x) != int(y):
      return i
  return None if len(a) == len(b) else min(len(a), len(b))


def _first_text_diff(a: str, b: str) -> str:
  i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  return f"first difference at character {i}: {a[i:i + 30]!r} vs {b[i:i + 30]!r}"


def turn_format(tokenizer, **kwargs) -> TurnFormat:
  """`ChatTemplateFormat` for a tokenizer whose chat template is in use (`uses_chat_template`:
  a Hugging Face model's, unless `--nochat_template`), `PlainFormat` otherwise."""
  if getattr(tokenizer, "uses_chat_template", False):
    return ChatTemplateFormat(tokenizer, **kwargs)
  return PlainFormat(tokenizer, **kwargs)


def demonstration_ids(fmt: TurnFormat, pieces: Sequence[tuple[str, bool]]
                      ) -> tuple[list[int], list[int]]:
  """An expert episode `[(text, is_policy_turn), ...]` (the first piece: the prompt) as the ids
  an episode driver would build and a 0/1 mask of the policy's tokens (its turns' text and stop
  token; not the prompt, the observations or the glue)."""
  ids, mask = [], []
  for j, (text, policy) in enumerate(pieces):
    if j == 0:
      part, m = fmt.prompt(text), None
    elif policy:
      turn = fmt.encode(text) + [fmt.stop_ids[0]]
      glue = fmt.close_turn(turn)
      part, m = turn + glue, [1] * len(turn) + [0] * len(glue)
    else:
      part, m = fmt.observation([text]), None
    ids += part
    mask += m if m is not None else [0] * len(part)
  return ids, mask

"""Tool-call parsers: the text of an action -> its calls, its problems and the rest.

Two styles:

- `HermesParser` (Qwen2.5 / Qwen3 / Hermes): `<tool_call>{"name": "search", "arguments":
  {"query": "..."}}</tool_call>`, a JSON object between the markers, any number per action.
- `PlainParser`: `<<name argument text>>`: the first word is the tool, the rest (stripped) is
  one string argument. Short enough for a character-level policy to learn.

A parser never raises on the policy's text: a call that is not valid (bad JSON, no name,
arguments that are not an object) is a `ParseIssue("malformed")`; an opening marker whose call
never closes is `ParseIssue("unclosed")`. `complete_calls(partial)` returns the calls already
closed in a partially streamed action (what speculative prefetch starts early).
"""
from __future__ import annotations

import json
from typing import Protocol

from jaxrl_sys.tasks.tools.base import ParsedAction, ParseIssue, ToolCall


class ToolCallParser(Protocol):
  """Parses actions written in one tool-call style."""
  name: str
  open: str
  close: str

  def parse(self, text: str) -> ParsedAction: ...

  def complete_calls(self, text: str) -> list[ToolCall]: ...

  def format_call(self, name: str, arguments) -> str: ...


class _MarkerParser:
  """Calls delimited by an opening and a closing marker; subclasses decode the body."""
  name = ""
  open = ""
  close = ""

  def _body(self, body: str, text: str) -> ToolCall | ParseIssue:
    raise NotImplementedError

  def _scan(self, text: str, final: bool):
    calls, issues, rest, i = [], [], [], 0
    while True:
      j = text.find(self.open, i)
      if j < 0:
        rest.append(text[i:])
        break
      rest.append(text[i:j])
      k = text.find(self.close, j + len(self.open))
      if k < 0:
        if final:
          issues.append(ParseIssue("unclosed", text[j:], f"the call {text[j:j + 60]!r} was "
                                   f"never closed with {self.close!r}"))
        break
      whole = text[j:k + len(self.close)]
      got = self._body(text[j + len(self.open):k], whole)
      (calls if isinstance(got, ToolCall) else issues).append(got)
      i = k + len(self.close)
    return calls, issues, "".join(rest)

  def parse(self, text: str) -> ParsedAction:
    """All calls of a finished action, its problems, and the text outside the calls."""
    calls, issues, rest = self._scan(text, final=True)
    return ParsedAction(tuple(calls), tuple(issues), rest)

  def complete_calls(self, text: str) -> list[ToolCall]:
    """The valid calls already closed in `text`, a prefix of an action still being written."""
    return self._scan(text, final=False)[0]


class HermesParser(_MarkerParser):
  """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen / Hermes chat models).

  `arguments` may also be a JSON string holding an object (some models write it so)."""
  name = "hermes"
  open = "<tool_call>"
  close = "</tool_call>"

  def _body(self, body: str, text: str) -> ToolCall | ParseIssue:
    try:
      obj = json.loads(body)
    except json.JSONDecodeError as e:
      return ParseIssue("malformed", text, f"the call is not valid JSON ({e.msg} at character "
                        f"{e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
      return ParseIssue("malformed", text, 'the call needs a JSON object with a "name" string')
    args = obj.get("arguments", {})
    if isinstance(args, str):
      try:
        args = json.loads(args) if args.strip() else {}
      except json.JSONDecodeError:
        return ParseIssue("malformed", text, '"arguments" is a string that is not JSON')
    if not isinstance(args, dict):
      return ParseIssue("malformed", text, '"arguments" must be a JSON object')
    return ToolCall(obj["name"], args, text)

  def format_call(self, name: str, arguments) -> str:
    args = arguments if isinstance(arguments, dict) else {"input": arguments}
    return f"{self.open}\n{json.dumps({'name': name, 'arguments': args})}\n{self.close}"


class PlainParser(_MarkerParser):
  """`<<name argument text>>`: the tool name, a space, one string argument."""
  name = "plain"
  open = "<<"
  close = ">>"

  def _body(self, body: str, text: str) -> ToolCall | ParseIssue:
    name, _, arg = body.strip().partition(" ")
    if not name or not all(c.isalnum() or c in "_-." for c in name):
      return ParseIssue("malformed", text, f"the call {text[:60]!r} does not start with a tool "
                        "name")
    return ToolCall(name, arg.strip(), text)

  def format_call(self, name: str, arguments) -> str:
    return f"{self.open}{name} {arguments}{self.close}"


PARSERS = {"hermes": HermesParser, "plain": PlainParser}


def make_parser(name: str) -> ToolCallParser:
  """A parser by style name ("hermes", "plain")."""
  if name not in PARSERS:
    raise ValueError(f"unknown tool-call style {name!r}; known: {sorted(PARSERS)}")
  return PARSERS[name]()

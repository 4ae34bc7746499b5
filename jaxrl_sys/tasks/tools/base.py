"""Tools, tool calls and tool results (plain data; no threads, no processes).

A `Tool` is a named function the policy may call: `fn(**arguments)` when a call carries a JSON
object of arguments (the Hermes style), `fn(text)` when it carries a string (the plain style).
It returns the observation text (`str`; `bytes` are decoded as UTF-8, invalid bytes replaced and
counted). `read_only=True` declares that calling it has no side effect and that its result
depends only on its arguments: such a call may be started speculatively, before the policy has
finished writing it (`agents.prefetch`), and a resumed episode may call it again.
`sandbox=True` runs it in a child process with CPU, memory and wall-time limits (untrusted
code); it then needs an importable `module:function` reference (`Tool.ref`).

Every failure a tool call can meet ends as a `ToolResult` whose `status` names it and whose
`text` says so to the policy (never an exception in the training run):

  ok           the tool returned
  malformed    the call is not parseable (bad JSON, no tool name)
  unclosed     the turn ended inside a call (the model never closed it)
  unknown      no tool of that name
  error        the tool raised (the exception's type and message are the observation)
  timeout      it ran past its time limit (the thread is abandoned, the child process killed)
  killed       a sandboxed child died from a resource limit (CPU seconds, memory)

and two flags that may come with any status: `truncated` (the output was longer than the
limit and was cut) and `bad_utf8` (the output was not valid UTF-8; invalid bytes replaced).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

STATUSES = ("ok", "malformed", "unclosed", "unknown", "error", "timeout", "killed")


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One call as the policy wrote it.

  Attributes:
    name: the tool's name.
    arguments: a JSON object (dict) or a string (the plain style).
    text: the exact text of the call in the action (markers included).
  """
  name: str
  arguments: Any
  text: str = ""

  @property
  def key(self) -> str:
    """The call's identity: two calls with the same key return the same result from a
    read-only tool (name and canonical JSON of the arguments; the raw text may differ in
    whitespace)."""
    return json.dumps([self.name, self.arguments], sort_keys=True, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class ParseIssue:
  """A part of an action that is not a valid call: `kind` is "malformed" or "unclosed",
  `text` the offending text, `message` what is wrong."""
  kind: str
  text: str
  message: str


@dataclasses.dataclass(frozen=True)
class ParsedAction:
  """An action's tool calls (in order), its problems, and the text outside the calls."""
  calls: tuple[ToolCall, ...] = ()
  issues: tuple[ParseIssue, ...] = ()
  content: str = ""

  @property
  def has_calls(self) -> bool:
    """Whether the action asked for tools (valid calls or broken ones)."""
    return bool(self.calls or self.issues)


@dataclasses.dataclass(frozen=True)
class ToolResult:
  """The outcome of one call (see the module docstring for `status`).

  Attributes:
    name: the tool called ("" for a malformed call).
    text: the observation text shown to the policy.
    status: one of `STATUSES`.
    seconds: wall time of the call (0 when it never ran).
    truncated: the output was cut to the executor's limit.
    bad_utf8: the output was not valid UTF-8 (invalid bytes replaced by U+FFFD).
    prefetched: the result came from a speculative call started before the action ended.
  """
  name: str
  text: str
  status: str = "ok"
  seconds: float = 0.0
  truncated: bool = False
  bad_utf8: bool = False
  prefetched: bool = False

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f"ToolResult.status must be one of {STATUSES}, got {self.status!r}")


@dataclasses.dataclass(frozen=True)
class Tool:
  """A function the policy may call (see the module docstring).

  Attributes:
    name: what the policy writes to call it.
    fn: the function (`fn(**arguments)` or `fn(text)`), returning `str` or `bytes`.
    description: one line for the tool list shown to the policy.
    read_only: no side effects and a result that depends only on the arguments (may be
      prefetched and called again on resumption).
    sandbox: run in a child process with resource limits (`executor.SandboxLimits`).
    timeout: seconds this tool may run (None: the executor's `--tool_timeout`).
    parameters: JSON schema of the arguments (for chat templates that list tools).
  """
  name: str
  fn: Callable[..., Any]
  description: str = ""
  read_only: bool = False
  sandbox: bool = False
  timeout: float | None = None
  parameters: dict | None = None

  def __post_init__(self):
    if not self.name or not all(c.isalnum() or c in "_-." for c in self.name):
      raise ValueError(f"tool name {self.name!r}: use letters, digits, '_', '-' or '.'")
    if not callable(self.fn):
      raise TypeError(f"tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
    if self.sandbox and not self.ref:
      raise ValueError(f"tool {self.name!r}: a sandboxed tool runs in a child process and needs "
                       "a module-level function (importable as module:function), not "
                       f"{self.fn!r}")

  @property
  def ref(self) -> str | None:
    """`module:qualname` of `fn` when it is importable at module level, else None."""
    module, qual = getattr(self.fn, "__module__", None), getattr(self.fn, "__qualname__", "")
    if not module or not qual or "<" in qual or "." in qual:
      return None
    return f"{module}:{qual}"

  def schema(self) -> dict:
    """The OpenAI-style function entry chat templates render (`{"type": "function", ...}`)."""
    params = self.parameters or {"type": "object", "properties": {
        "input": {"type": "string"}}, "required": ["input"]}
    return {"type": "function", "function": {"name": self.name, "description": self.description,
                                             "parameters": params}}


def call_tool_fn(fn: Callable[..., Any], arguments: Any) -> Any:
  """Calls `fn` with a call's arguments: keywords for a JSON object, one positional string
  otherwise."""
  if isinstance(arguments, dict):
    return fn(**arguments)
  return fn(arguments)

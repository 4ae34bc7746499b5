"""Tools for multi-turn episodes: definitions, call parsers, a bounded executor, MCP servers.

- `Tool(name, fn, read_only=..., sandbox=...)`, `ToolCall`, `ToolResult` (its `status` names
  every outcome: ok, malformed, unclosed, unknown, error, timeout, killed), `ParsedAction`.
- `HermesParser` (`<tool_call>{json}</tool_call>`, Qwen / Hermes) and `PlainParser`
  (`<<name argument>>`); `make_parser(style)`.
- `ToolExecutor(workers, timeout, max_output_chars, SandboxLimits(...))`: threads by default, a
  child process with CPU / memory / wall-time limits for `Tool(sandbox=True)`; counts outcomes.
- `McpServer(command, args)`: the tools of a stdio MCP server (`mcp` package) as `Tool`s.
"""
from jaxrl_sys.tasks.tools.base import (STATUSES, ParsedAction, ParseIssue, Tool, ToolCall,
                                        ToolResult, call_tool_fn)
from jaxrl_sys.tasks.tools.executor import SandboxLimits, ToolExecutor, clean_output
from jaxrl_sys.tasks.tools.parsers import (PARSERS, HermesParser, PlainParser, ToolCallParser,
                                           make_parser)

__all__ = ["HermesParser", "McpServer", "PARSERS", "ParseIssue", "ParsedAction", "PlainParser",
           "STATUSES", "SandboxLimits", "Tool", "ToolCall", "ToolCallParser", "ToolExecutor",
           "ToolResult", "call_tool_fn", "clean_output", "make_parser"]


def __getattr__(name):
  if name == "McpServer":  # imports the `mcp` package only when used
    from jaxrl_sys.tasks.tools.mcp_tools import McpServer  # pylint: disable=import-outside-toplevel
    return McpServer
  raise AttributeError(name)

"""Tools served by an MCP server over stdio (the `mcp` package), callable from any thread.

    server = McpServer("python", ["my_server.py"])
    env = MyToolEnv(tools=server.tools())      # one `Tool` per tool the server lists
    ...
    server.close()

The server runs as a child process; one background thread runs the asyncio loop holding the
client session, and each `Tool.fn` submits its call to that loop and waits for the answer, so
the tools run in the `ToolExecutor` like local ones (its timeout, output limit and counts
apply). A tool is read-only (may be prefetched) when the server's annotations say so
(`readOnlyHint`) or its name is in `read_only`. A result flagged as an error by the server
raises `McpToolError` (the executor turns it into an `error` observation).
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from typing import Any, Iterable, Mapping, Sequence

from jaxrl_sys.tasks.tools.base import Tool


class McpToolError(RuntimeError):
  """The MCP server answered a call with `isError` (the message is its text)."""


def _import_mcp():
  try:
    import mcp  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("MCP tools need the `mcp` package (pip install mcp; a dependency of "
                      "jaxrl_sys)") from e
  return mcp


class McpServer:
  """A stdio MCP server and its client session (see the module docstring).

  Args:
    command, args: the server's command line.
    env: extra environment variables for the server.
    read_only: names of tools to treat as read-only whatever the server's annotations say.
    start_timeout: seconds to wait for the server to start and list its tools.
    errlog: where the server's stderr goes (default: this process's stderr).
  """

  def __init__(self, command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
               read_only: Iterable[str] = (), start_timeout: float = 60.0, errlog=None):
    self._mcp = _import_mcp()
    self.command, self.args, self.env = command, list(args), dict(env or {})
    self.read_only = set(read_only)
    self._errlog = errlog
    self._loop = asyncio.new_event_loop()
    self._session = None
    self._stop: asyncio.Event | None = None
    self._ready: cf.Future = cf.Future()
    self._listed: list = []
    self._thread = threading.Thread(target=self._serve, name="mcp-client", daemon=True)
    self._thread.start()
    try:
      self._ready.result(timeout=start_timeout)
    except cf.TimeoutError:
      self.close()
      raise RuntimeError(f"MCP server {command} {' '.join(args)} did not list its tools within "
                         f"{start_timeout:g} s") from None
    except Exception as e:
      self.close()
      raise RuntimeError(f"MCP server {command} {' '.join(args)} failed to start: "
                         f"{type(e).__name__}: {e}") from e

  def _serve(self) -> None:
    asyncio.set_event_loop(self._loop)
    try:
      self._loop.run_until_complete(self._main())
    except BaseException as e:  # pylint: disable=broad-except
      if not self._ready.done():
        self._ready.set_exception(e)
    finally:
      self._loop.close()

  async def _main(self) -> None:
    mcp = self._mcp
    params = mcp.StdioServerParameters(command=self.command, args=self.args, env=self.env or None)
    self._stop = asyncio.Event()
    streams = (mcp.stdio_client(params) if self._errlog is None
               else mcp.stdio_client(params, errlog=self._errlog))
    async with streams as (read, write):
      async with mcp.ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        self._session, self._listed = session, list(listed.tools)
        self._ready.set_result(True)
        await self._stop.wait()

  def tools(self) -> list[Tool]:
    """One `Tool` per tool the server listed (name, description, JSON schema, read-only)."""
    out = []
    for t in self._listed:
      hint = getattr(getattr(t, "annotations", None), "read_only_hint", None)
      out.append(Tool(t.name, _Caller(self, t.name), description=t.description or "",
                      read_only=bool(hint) or t.name in self.read_only,
                      parameters=dict(t.input_schema) if getattr(t, "input_schema", None)
                      else None))
    return out

  def call(self, name: str, arguments: Any, timeout: float | None = None) -> str:
    """Calls tool `name` and returns its text content (blocks this thread, not the loop)."""
    if self._session is None or self._loop.is_closed():
      raise RuntimeError("the MCP server is not running")
    args = arguments if isinstance(arguments, dict) else {"input": arguments}
    fut = asyncio.run_coroutine_threadsafe(self._session.call_tool(name, args), self._loop)
    res = fut.result(timeout)
    text = "\n".join(getattr(c, "text", "") for c in res.content if getattr(c, "text", None))
    if res.is_error:
      raise McpToolError(text or f"MCP tool {name} failed")
    return text

  def close(self) -> None:
    """Ends the session and the server process (idempotent)."""
    if self._stop is not None and not self._loop.is_closed():
      try:
        self._loop.call_soon_threadsafe(self._stop.set)
      except RuntimeError:  # the loop closed meanwhile
        pass
    self._thread.join(timeout=15)

  def __enter__(self) -> "McpServer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _Caller:
  """`Tool.fn` of an MCP tool: keywords (Hermes) or one string (plain) -> the server's text."""

  def __init__(self, server: McpServer, name: str):
    self.server, self.name = server, name

  def __call__(self, *args, **kwargs) -> str:
    return self.server.call(self.name, kwargs if kwargs or not args else args[0])

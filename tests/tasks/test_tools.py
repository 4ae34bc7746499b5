"""Tool-call parsers, the bounded executor (threads and the sandbox), MCP tools over stdio."""
import os
import sys
import textwrap
import time

import pytest

from jaxrl_sys.tasks.tools import (HermesParser, PlainParser, SandboxLimits, Tool, ToolCall,
                                   ToolExecutor)
from tests.tasks import sandbox_tools as st


def test_hermes_parser():
  p = HermesParser()
  text = ('I will look.<tool_call>\n{"name": "search", "arguments": {"query": "kabo"}}\n'
          '</tool_call> and <tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>'
          '<tool_call>{"name": 3}</tool_call><tool_call>not json</tool_call><tool_call>{"na')
  got = p.parse(text)
  assert [(c.name, c.arguments) for c in got.calls] == [("search", {"query": "kabo"}),
                                                        ("calc", {"x": 1})]
  assert [i.kind for i in got.issues] == ["malformed", "malformed", "unclosed"]
  assert got.content == "I will look. and "
  assert [c.name for c in p.complete_calls(text)] == ["search", "calc"]
  assert p.parse("just an answer").calls == () and not p.parse("just an answer").has_calls
  # the canonical key ignores the JSON's whitespace and key order
  a = p.parse('<tool_call>{"name":"f","arguments":{"a":1,"b":2}}</tool_call>').calls[0]
  b = p.parse('<tool_call>{"arguments": {"b": 2, "a": 1}, "name": "f"}</tool_call>').calls[0]
  assert a.key == b.key and a.text != b.text


def test_plain_parser():
  p = PlainParser()
  got = p.parse("<<search kabo>> then <<calc 1+2>><< >><<calc 3")
  assert [(c.name, c.arguments) for c in got.calls] == [("search", "kabo"), ("calc", "1+2")]
  assert [i.kind for i in got.issues] == ["malformed", "unclosed"]
  assert p.complete_calls("<<search ka") == [] and len(p.complete_calls("<<search ka>>x")) == 1
  assert p.parse(p.format_call("calc", "4*5")).calls[0] == ToolCall("calc", "4*5", "<<calc 4*5>>")


def test_executor_outcomes():
  ex = ToolExecutor(workers=3, timeout=0.5, max_output_chars=100,
                    sandbox=SandboxLimits(cpu_seconds=2, memory_mb=256))
  cases = {
      "ok": (Tool("echo", st.echo), "hi"),
      "error": (Tool("boom", st.boom), "x"),
      "timeout": (Tool("sleepy", st.sleepy), "2"),
      "truncated": (Tool("big", st.big), "x"),
      "bad_utf8": (Tool("bad", st.bad_utf8), "x"),
      "sandbox_ok": (Tool("echo", st.echo, sandbox=True), "there"),
      "sandbox_error": (Tool("boom", st.boom, sandbox=True), "y"),
      "sandbox_timeout": (Tool("spin", st.spin, sandbox=True), "x"),
      "sandbox_memory": (Tool("hog", st.hog, sandbox=True), "x"),
      "sandbox_big": (Tool("big", st.big, sandbox=True), "x"),
  }
  t0 = time.monotonic()
  futs = {k: ex.submit(t, ToolCall(t.name, a)) for k, (t, a) in cases.items()}
  res = {k: f.result(timeout=30) for k, f in futs.items()}
  assert time.monotonic() - t0 < 20
  assert res["ok"].status == "ok" and res["ok"].text == "echo hi"
  assert res["error"].status == "error" and "ZeroDivisionError: boom x" in res["error"].text
  assert res["timeout"].status == "timeout" and "timed out after 0.5 s" in res["timeout"].text
  assert res["truncated"].truncated and res["truncated"].text.startswith("z" * 100)
  assert "10485760 characters" in res["truncated"].text
  assert res["bad_utf8"].bad_utf8 and res["bad_utf8"].text == "ab\ufffd\ufffdcd"
  assert res["sandbox_ok"].text == "echo there"
  assert res["sandbox_error"].status == "error" and "boom y" in res["sandbox_error"].text
  assert res["sandbox_timeout"].status == "timeout"
  assert res["sandbox_memory"].status == "killed" and "256 MiB" in res["sandbox_memory"].text
  assert res["sandbox_big"].truncated
  assert res["ok"].seconds < 0.5 <= res["timeout"].seconds
  m = ex.metrics()
  assert m["tool_calls"] == len(cases) and m["tool_timeout"] == 2 and m["tool_killed"] == 1
  assert m["tool_threads_abandoned"] == 1 and m["tool_truncated"] == 2
  # the pool is bounded: 3 workers, 6 calls of 0.3 s take two rounds
  t0 = time.monotonic()
  ex.run({"sleepy": Tool("sleepy", st.sleepy)}, [ToolCall("sleepy", "0.3")] * 6)
  assert time.monotonic() - t0 >= 0.6
  assert ex.submit(None, ToolCall("nope", "")).result().status == "unknown"
  ex.close()


def test_sandboxed_tool_needs_an_importable_function():
  with pytest.raises(ValueError, match="module-level function"):
    Tool("f", lambda x: x, sandbox=True)


def test_mcp_server_tools(tmp_path):
  server_py = tmp_path / "server.py"
  server_py.write_text(textwrap.dedent("""
      from mcp.server.mcpserver import MCPServer
      from mcp_types import ToolAnnotations
      server = MCPServer("demo")

      @server.tool(annotations=ToolAnnotations(read_only_hint=True))
      def add(a: int, b: int) -> str:
        '''Adds two integers.'''
        return str(a + b)

      @server.tool()
      def fail(x: str) -> str:
        raise ValueError("no " + x)

      server.run("stdio")
      """))
  from jaxrl_sys.tasks.tools import McpServer  # pylint: disable=import-outside-toplevel
  ex = ToolExecutor(workers=2, timeout=10)
  with open(os.devnull, "w", encoding="utf-8") as quiet:
    with McpServer(sys.executable, [str(server_py)], errlog=quiet) as server:
      tools = {t.name: t for t in server.tools()}
      assert tools["add"].read_only and not tools["fail"].read_only
      assert tools["add"].parameters["required"] == ["a", "b"]
      ok, bad = ex.run(tools, [ToolCall("add", {"a": 2, "b": 40}), ToolCall("fail", {"x": "y"})])
  assert (ok.status, ok.text) == ("ok", "42")
  assert bad.status == "error" and "McpToolError" in bad.text
  ex.close()

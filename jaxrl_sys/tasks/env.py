"""The environment protocol of multi-turn episodes (gym-style, text in, text out).

    class Env(Protocol):
      def reset(self, problem: Problem) -> str            # the first observation (the prompt)
      def step(self, action: Action) -> EnvStep           # or `async def step(...)`

One env object serves one episode: the episode driver (`agents.EpisodeDriver`) builds a fresh
one per episode from a factory (the env class), calls `reset` with the episode's problem, then
`step` after each policy turn, on a thread of its own (or on its asyncio loop for an `async def
step`), so other episodes generate meanwhile. `EnvStep.observation` is the text of the next
observation turn (a list: one text per tool result); the driver turns it into token ids with
the tokenizer's turn format (`tasks.turns`) and never re-tokenizes what the policy sampled.
The episode reward is the sum of the steps' rewards (per-turn rewards plus the final one).

Optional methods: `snapshot() -> dict` (JSON) and `restore(problem, snapshot)` let a
checkpointed in-flight episode resume without calling its tools again; an env without them is
rebuilt by `reset` and a replay of the recorded actions through `step`.

- `TaskEnv(task)`: a single-turn `Task` as the one-turn case (the reward of the first action).
- `ToolEnv`: actions may call tools (`tasks.tools`): the calls are parsed, run in the driver's
  `ToolExecutor` (bound by the driver: `bind(runner)`), and every result, failures included,
  becomes an observation; an action without a call is the final answer, scored by `score`.
- `load_env("module:Class")`: `--env=module:Class` (as `--reward=module:function`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from jaxrl_sys.tasks.base import Problem
from jaxrl_sys.tasks.rewards import load_object
from jaxrl_sys.tasks.tools.base import ToolCall, ToolResult, Tool, call_tool_fn
from jaxrl_sys.tasks.tools.executor import clean_output
from jaxrl_sys.tasks.tools.parsers import PlainParser, ToolCallParser


@dataclasses.dataclass(frozen=True)
class Action:
  """One policy turn.

  Attributes:
    text: the sampled tokens as text (the closing stop token removed).
    tokens: `[n]` int32 sampled ids (the stop token included when the turn ended on one).
    turn: 0 for the first turn.
    finished: the turn ended on a stop token (False: its token budget ran out).
  """
  text: str
  tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  turn: int = 0
  finished: bool = True


@dataclasses.dataclass(frozen=True)
class EnvStep:
  """The environment's answer to an action.

  Attributes:
    observation: text(s) of the next observation turn (None or empty when `done`).
    reward: this step's reward (the final one when `done`; per-turn rewards otherwise).
    done: the episode is over.
    info: anything to record (`tool_results`: the `ToolResult`s of the step's calls; `success`:
      whether the episode solved its problem, for the metrics).
  """
  observation: str | Sequence[str] | None = None
  reward: float = 0.0
  done: bool = False
  info: dict = dataclasses.field(default_factory=dict)

  def texts(self) -> list[str]:
    """The observation as a list of texts (one per tool result)."""
    if self.observation is None:
      return []
    return [self.observation] if isinstance(self.observation, str) else list(self.observation)


class Env(Protocol):
  """One episode's environment (see the module docstring)."""

  def reset(self, problem: Problem) -> str: ...

  def step(self, action: Action) -> EnvStep: ...


class ToolRunner(Protocol):
  """Runs tool calls for an env (the driver's, with its executor and prefetched results)."""

  def run(self, tools: Mapping[str, Tool], calls: Sequence[ToolCall]) -> list[ToolResult]: ...


class DirectRunner:
  """Runs calls one after the other in this thread (an env used outside a driver)."""

  def __init__(self, max_output_chars: int = 8192):
    self.max_output_chars = max_output_chars

  def run(self, tools: Mapping[str, Tool], calls: Sequence[ToolCall]) -> list[ToolResult]:
    out = []
    for c in calls:
      tool = tools.get(c.name)
      if tool is None:
        out.append(ToolResult(c.name, f"error: unknown tool {c.name!r}", "unknown"))
        continue
      try:
        text, cut, bad = clean_output(call_tool_fn(tool.fn, c.arguments), self.max_output_chars)
        out.append(ToolResult(c.name, text, "ok", truncated=cut, bad_utf8=bad))
      except Exception as e:  # pylint: disable=broad-except
        out.append(ToolResult(c.name, f"error: tool {c.name} raised {type(e).__name__}: {e}",
                              "error"))
    return out


class TaskEnv:
  """A single-turn `Task` as an env: the prompt is the problem's, the first action is the
  answer, scored by `task.reward` (one turn, done)."""

  def __init__(self, task):
    self.task = task
    self.problem: Problem | None = None

  def reset(self, problem: Problem) -> str:
    self.problem = problem
    return problem.prompt

  def step(self, action: Action) -> EnvStep:
    return EnvStep(None, float(self.task.reward(self.problem, action.text)), True)

  def snapshot(self) -> dict:
    return {}

  def restore(self, problem: Problem, snapshot: dict) -> None:
    del snapshot
    self.problem = problem


class ToolEnv:
  """An env whose actions may call tools (see the module docstring).

  Subclasses give `tools` and `score(problem, answer) -> float` (the final reward); they may
  override `prompt(problem)` (the first observation; default the problem's prompt),
  `format_result(result)` (the observation text of one result; default its text) and
  `turn_reward(results)` (a per-turn reward; default 0).

  Args:
    tools: the tools the policy may call (default: the class attribute `tools`).
    parser: the tool-call style (default: the class attribute `parser`, `PlainParser()`).
  """
  tools: Sequence[Tool] = ()
  parser: ToolCallParser = PlainParser()

  def __init__(self, tools: Sequence[Tool] | None = None, parser: ToolCallParser | None = None):
    if tools is not None:
      self.tools = tuple(tools)
    if parser is not None:
      self.parser = parser
    self.by_name = {t.name: t for t in self.tools}
    if len(self.by_name) != len(self.tools):
      raise ValueError(f"duplicate tool names: {[t.name for t in self.tools]}")
    self.runner: ToolRunner = DirectRunner()
    self.problem: Problem | None = None
    self.turns = 0

  def bind(self, runner: ToolRunner) -> None:
    """Runs this env's calls through `runner` (the driver's executor)."""
    self.runner = runner

  # ----- overridable -----------------------------------------------------------------------------
  def prompt(self, problem: Problem) -> str:
    return problem.prompt

  def score(self, problem: Problem, answer: str) -> float:
    raise NotImplementedError(f"{type(self).__name__} must define score(problem, answer)")

  def success(self, problem: Problem, answer: str, reward: float) -> bool:
    """Whether the final answer solved the problem (for the `episode_success` metric)."""
    del problem, answer
    return reward > 0

  def format_result(self, result: ToolResult) -> str:
    return result.text

  def turn_reward(self, results: Sequence[ToolResult]) -> float:
    del results
    return 0.0

  # ----- the protocol ----------------------------------------------------------------------------
  def reset(self, problem: Problem) -> str:
    self.problem, self.turns = problem, 0
    return self.prompt(problem)

  def step(self, action: Action) -> EnvStep:
    self.turns += 1
    parsed = self.parser.parse(action.text)
    if not parsed.has_calls:
      answer = parsed.content.strip()
      reward = float(self.score(self.problem, answer))
      return EnvStep(None, reward, True, {"answer": answer,
                                          "success": self.success(self.problem, answer, reward)})
    results = [ToolResult("", f"error: {i.message}", i.kind) for i in parsed.issues]
    results += self.runner.run(self.by_name, list(parsed.calls))
    return EnvStep([self.format_result(r) for r in results], float(self.turn_reward(results)),
                   False, {"tool_results": results})

  def snapshot(self) -> dict:
    return {"turns": self.turns}

  def restore(self, problem: Problem, snapshot: dict) -> None:
    self.problem, self.turns = problem, int(snapshot.get("turns", 0))


def load_env(spec: str) -> Any:
  """The env class (or factory) named by "module:Class" or "path/to/file.py:Class"
  (`--env`); ValueError naming what is wrong."""
  return load_object(spec, "env", "Class")


def call_env_factory(factory: Any, task: Any = None) -> Any:
  """An env from a factory: called with the task when it takes one (`factory(task)`), else
  with no argument."""
  import inspect  # pylint: disable=import-outside-toplevel
  try:
    params = inspect.signature(factory).parameters
  except (TypeError, ValueError):
    params = {}
  required = [p for p in params.values() if p.default is p.empty
              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  return factory(task) if required else factory()

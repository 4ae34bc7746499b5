"""The calculator task: multi-step arithmetic that a small policy can only solve with a tool.

Problem i (a pure function of the seed and i) is an expression of `num_ops` operations on
`digits`-digit numbers, evaluated left to right and written with the parentheses that say so:
`(23*47)+5=`. The tool `calc` is a pocket calculator: one operation per call (`<<calc 23*47>>`
answers `1081`), so the policy needs one call per operation, copying each intermediate result
into the next call, then writes the final number. Reward 1 for the exact value, else 0.

`CalculatorTask` is the task (problems, the final-answer reward, `demonstration` episodes for
the supervised warm-up); `CalculatorEnv` the episode environment (`tasks.env.ToolEnv`, plain
call style).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_sys.tasks.arithmetic import parse_integer_answer
from jaxrl_sys.tasks.base import Problem
from jaxrl_sys.tasks.env import ToolEnv
from jaxrl_sys.tasks.tools.base import Tool
from jaxrl_sys.tasks.tools.parsers import PlainParser

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def calc(expression: str) -> str:
  """One operation on two integers: "a+b", "a-b" or "a*b" (a may be negative) -> the result."""
  s = expression.replace(" ", "")
  for i, ch in enumerate(s):
    if i > 0 and ch in _OPS:
      a, b = s[:i], s[i + 1:]
      if a.lstrip("-").isdigit() and b.isdigit():
        return str(_OPS[ch](int(a), int(b)))
  raise ValueError(f"calc takes one operation on two integers (a+b, a-b, a*b), got {expression!r}")


CALC = Tool("calc", calc, "one operation on two integers: a+b, a-b or a*b", read_only=True,
            parameters={"type": "object", "properties": {"expression": {"type": "string"}},
                        "required": ["expression"]})


@dataclasses.dataclass(frozen=True)
class CalculatorTask:
  """Left-to-right arithmetic needing one `calc` call per operation (module docstring).

  Attributes:
    num_ops: operations per expression (calls per episode).
    digits: digits of the first operand (the others have 1 to `digits`).
    ops: operations drawn from "+-*".
    seed: data seed.
  """
  num_ops: int = 2
  digits: int = 2
  ops: str = "+-*"
  seed: int = 0
  name: str = "calculator"

  def __post_init__(self):
    if self.num_ops < 1 or self.digits < 1:
      raise ValueError(f"CalculatorTask: num_ops and digits must be >= 1, got {self.num_ops}, "
                       f"{self.digits}")
    if not self.ops or set(self.ops) - set(_OPS):
      raise ValueError(f"CalculatorTask ops must be drawn from '+-*', got {self.ops!r}")

  alphabet = "0123456789+-*()=<>acl? \n"
  tool_style = "plain"

  def _steps(self, index: int) -> tuple[list[tuple[int, str, int]], int]:
    rng = np.random.default_rng([self.seed, index, 29])
    lo = 10 ** (self.digits - 1) if self.digits > 1 else 0
    value = int(rng.integers(lo, 10 ** self.digits))
    steps = []
    for _ in range(self.num_ops):
      op = self.ops[int(rng.integers(len(self.ops)))]
      b = int(rng.integers(1 if op == "*" else 0, 10 ** int(rng.integers(1, self.digits + 1))))
      steps.append((value, op, b))
      value = _OPS[op](value, b)
    return steps, value

  def problem(self, index: int) -> Problem:
    steps, value = self._steps(index)
    expr = str(steps[0][0])
    for i, (_, op, b) in enumerate(steps):
      expr = (f"({expr})" if i and steps[i - 1][1] in "+-" and op == "*" else expr) + f"{op}{b}"
    return Problem(prompt=f"{expr}=", answer=str(value),
                   meta={"value": value, "calls": [f"{a}{op}{b}" for a, op, b in steps]})

  def reward(self, problem: Problem, completion: str) -> float:
    got = parse_integer_answer(completion)
    return float(got is not None and got == problem.meta["value"])

  def demonstration(self, index: int) -> list[tuple[str, bool]]:
    """An expert episode as `(text, is_policy_turn)` pieces: the prompt, then per operation a
    call and its result, then the answer."""
    p = self.problem(index)
    out = [(p.prompt, False)]
    for call in p.meta["calls"]:
      out += [(f"<<calc {call}>>", True), (calc(call), False)]
    return out + [(p.answer, True)]

  def make_env(self) -> "CalculatorEnv":
    return CalculatorEnv(self)


class CalculatorEnv(ToolEnv):
  """The calculator episode: `calc` calls answered, the final number scored by the task."""
  tools = (CALC,)
  parser = PlainParser()

  def __init__(self, task: CalculatorTask | None = None):
    super().__init__()
    self.task = task or CalculatorTask()

  def score(self, problem: Problem, answer: str) -> float:
    return self.task.reward(problem, answer)

"""Countdown: combine the given numbers with + - * to reach the target.

The reward parses the completion with a small recursive-descent parser (no `eval`): 1.0 when
the expression uses each given number at most once, only numbers from the list, and evaluates
to the target; 0.0 otherwise.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_sys.tasks.base import Problem


class _Parser:
  """expr := term (('+'|'-') term)*; term := atom ('*' atom)*; atom := int | '(' expr ')'."""

  def __init__(self, text: str):
    self.s, self.i, self.numbers = text.replace(" ", ""), 0, []

  def parse(self) -> int:
    v = self.expr()
    if self.i != len(self.s):
      raise ValueError(f"unexpected {self.s[self.i]!r} at {self.i}")
    return v

  def expr(self):
    v = self.term()
    while self.i < len(self.s) and self.s[self.i] in "+-":
      op = self.s[self.i]
      self.i += 1
      w = self.term()
      v = v + w if op == "+" else v - w
    return v

  def term(self):
    v = self.atom()
    while self.i < len(self.s) and self.s[self.i] == "*":
      self.i += 1
      v = v * self.atom()
    return v

  def atom(self):
    if self.i < len(self.s) and self.s[self.i] == "(":
      self.i += 1
      v = self.expr()
      if self.i >= len(self.s) or self.s[self.i] != ")":
        raise ValueError("missing ')'")
      self.i += 1
      return v
    j = self.i
    while j < len(self.s) and self.s[j].isdigit():
      j += 1
    if j == self.i:
      raise ValueError(f"expected a number at {self.i}")
    n = int(self.s[self.i:j])
    self.numbers.append(n)
    self.i = j
    return n


def evaluate(expression: str) -> tuple[int, list[int]]:
  """Value of an expression over + - * and parentheses, and the numbers it uses."""
  p = _Parser(expression)
  return p.parse(), p.numbers


@dataclasses.dataclass(frozen=True)
class CountdownTask:
  """`count` numbers in [1, max_number]; the target is built from a random expression over a
  random subset of them, so every problem is solvable (the answer is that expression)."""
  count: int = 3
  max_number: int = 9
  seed: int = 0
  name: str = "countdown"

  def problem(self, index: int) -> Problem:
    rng = np.random.default_rng([self.seed, index, 29])
    nums = [int(x) for x in rng.integers(1, self.max_number + 1, self.count)]
    k = int(rng.integers(2, self.count + 1))
    used = [nums[i] for i in rng.permutation(self.count)[:k]]
    expr = str(used[0])
    for n in used[1:]:
      expr = f"{expr}{'+-*'[int(rng.integers(3))]}{n}"
    target, _ = evaluate(expr)
    prompt = f"{' '.join(map(str, nums))}:{target}="
    return Problem(prompt=prompt, answer=expr, meta={"numbers": nums, "target": target})

  def reward(self, problem: Problem, completion: str) -> float:
    text = completion.strip().split("\n")[0]
    try:
      value, used = evaluate(text)
    except ValueError:
      return 0.0
    pool = list(problem.meta["numbers"])
    for n in used:
      if n not in pool:
        return 0.0
      pool.remove(n)
    return float(value == problem.meta["target"])

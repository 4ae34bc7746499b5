"""Multi-digit arithmetic with an exact-match reward."""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_sys.tasks.base import Problem


def parse_integer_answer(text: str) -> int | None:
  """The integer at the start of `text` (optional sign, digits), or None."""
  s = text.strip()
  i = 1 if s[:1] == "-" else 0
  j = i
  while j < len(s) and s[j].isdigit():
    j += 1
  if j == i:
    return None
  return int(s[:j])


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
  """"a+b=" style problems; operands have 1..`num_digits` digits; ops from `ops`.

  Subtraction never goes negative unless `allow_negative`. Reward 1.0 when the completion
  starts with the exact integer result, else 0.0; what follows the integer is not read.

  `filler` > 0 makes length free (for length-bias studies, e.g. GRPO vs Dr. GRPO): each
  reference answer is followed by 0..`filler` spaces (a count drawn per problem, independent
  of the problem), so the supervised warm-up teaches a spread of lengths that the reward does
  not see. Give the run `max_new_tokens` >= the longest answer + `filler` + 1.
  """
  num_digits: int = 2
  ops: str = "+-"
  seed: int = 0
  allow_negative: bool = False
  min_digits: int = 1
  filler: int = 0
  name: str = "arithmetic"

  def __post_init__(self):
    if not 1 <= self.min_digits <= self.num_digits:
      raise ValueError(f"need 1 <= min_digits <= num_digits, got {self.min_digits}, "
                       f"{self.num_digits}")
    bad = set(self.ops) - set("+-*")
    if bad or not self.ops:
      raise ValueError(f"ArithmeticTask ops must be drawn from '+-*', got {self.ops!r}")
    if self.filler < 0:
      raise ValueError(f"ArithmeticTask filler must be >= 0, got {self.filler}")

  def problem(self, index: int) -> Problem:
    rng = np.random.default_rng([self.seed, index, 17])

    def operand():
      d = int(rng.integers(self.min_digits, self.num_digits + 1))
      lo = 0 if d == 1 else 10 ** (d - 1)
      return int(rng.integers(lo, 10 ** d))

    a, b = operand(), operand()
    op = self.ops[int(rng.integers(len(self.ops)))]
    if op == "-" and not self.allow_negative and b > a:
      a, b = b, a
    value = a + b if op == "+" else a - b if op == "-" else a * b
    pad = int(rng.integers(self.filler + 1)) if self.filler else 0
    return Problem(prompt=f"{a}{op}{b}=", answer=str(value) + " " * pad, meta={"value": value})

  def reward(self, problem: Problem, completion: str) -> float:
    got = parse_integer_answer(completion)
    return float(got is not None and got == problem.meta["value"])

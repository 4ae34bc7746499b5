"""A user's env for `--env`: the sums of examples/sums.jsonl with an `add` tool.

    python -m experiments.grpo --task=jsonl:examples/sums.jsonl \\
        --env=examples.adder_env:AdderEnv --max_turns=2 --steps=20

The policy may write `<<add 8+2>>` (the plain call style), reads the result, and answers; the
answer is scored against the row's `answer` field.
"""
from jaxrl_sys.tasks import Tool, ToolEnv


def add(expression: str) -> str:
  """"a+b" -> the sum (a ValueError for anything else becomes an error observation)."""
  a, b = expression.split("+")
  return str(int(a) + int(b))


class AdderEnv(ToolEnv):
  """One read-only tool; the final answer must equal the data row's answer."""
  tools = (Tool("add", add, "adds two integers: a+b", read_only=True),)

  def score(self, problem, answer):
    return float(answer.strip() == problem.answer.strip())

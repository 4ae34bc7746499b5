"""Reward of examples/sums.jsonl: `--task=jsonl:examples/sums.jsonl
--reward=examples.sums_reward:score` (run from the repository root)."""
import re


def score(prompt: str, completion: str, answer: str, **row) -> float:
  """1.0 when the completion starts with the exact integer answer, else 0.0."""
  del prompt, row
  m = re.match(r"\s*(-?\d+)", completion)
  return float(m is not None and m.group(1) == str(answer))

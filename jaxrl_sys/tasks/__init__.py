"""Verifiable tasks with programmatic rewards, and a tokenizer for them.

- `CharTokenizer`: pad 0 / bos 1 / eos 2 + one id per character.
- `ArithmeticTask`, `CountdownTask`: problems are a pure function of an integer index.
- `make_task(name, **kw)`, `score_completions(task, problems, texts) -> (rewards [n] f32, errors)`.
- `supervised_examples(...)`: warm-up sequences; `extract_gsm8k_answer`, `gsm8k_reward`.
"""
from jaxrl_sys.tasks.arithmetic import ArithmeticTask, parse_integer_answer
from jaxrl_sys.tasks.base import (Problem, RewardError, SupervisedBatch, Task, score_completions,
                                  supervised_examples)
from jaxrl_sys.tasks.countdown import CountdownTask, evaluate
from jaxrl_sys.tasks.gsm8k import extract_gsm8k_answer, gsm8k_reward
from jaxrl_sys.tasks.tokenizer import CharTokenizer

TASKS = {"arithmetic": ArithmeticTask, "countdown": CountdownTask}


def make_task(name: str, **kwargs) -> Task:
  """Builds a task by name; unknown names and keys raise errors that name them."""
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
  try:
    return TASKS[name](**kwargs)
  except TypeError as e:
    raise ValueError(f"bad arguments for task {name!r}: {e}") from e


__all__ = [
    "ArithmeticTask", "CharTokenizer", "CountdownTask", "Problem", "RewardError",
    "SupervisedBatch", "TASKS", "Task", "evaluate", "extract_gsm8k_answer", "gsm8k_reward",
    "make_task", "parse_integer_answer", "score_completions", "supervised_examples",
]

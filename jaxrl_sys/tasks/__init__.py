"""Verifiable tasks with programmatic rewards, and a tokenizer for them.

- `Task` and `Tokenizer`: the protocols a task and its tokenizer implement (`tasks.base`).
- `CharTokenizer`: pad 0 / bos 1 / eos 2 + one id per character.
- Multi-turn tasks: the env protocol `Env` (`reset` / `step`, `TaskEnv`, `ToolEnv`, `load_env`
  for `--env=module:Class`), tools (`tasks.tools`), turn formats (`tasks.turns`), and the
  shipped `CalculatorTask` and `SearchTask` with their envs.
- `ArithmeticTask`, `CountdownTask`: problems are a pure function of an integer index.
- `DatasetTask`: prompts from JSONL / Parquet / `datasets` rows, scored by a user function
  `fn(prompt, completion, **row) -> float` (`load_reward("module:function")`).
- `make_task(name, reward=None, **kw)`: a built-in name or "jsonl:PATH" (also "parquet:",
  "datasets:").
- `score_completions(task, problems, texts) -> (rewards [n] f32, errors)`; `CountingTask`
  counts reward failures for the metrics; `reward_value` is the one check of a reward value.
- `supervised_examples(...)`: warm-up sequences; `extract_gsm8k_answer`, `gsm8k_reward`.
"""
from jaxrl_sys.tasks.arithmetic import ArithmeticTask, parse_integer_answer
from jaxrl_sys.tasks.calculator import CalculatorEnv, CalculatorTask
from jaxrl_sys.tasks.base import (NonFiniteRewardError, Problem, RewardError, RewardValueError,
                                  SupervisedBatch, Task, Tokenizer, supervised_examples)
from jaxrl_sys.tasks.countdown import CountdownTask, evaluate
from jaxrl_sys.tasks.dataset import DatasetTask, make_dataset_task, parse_task_spec, read_rows
from jaxrl_sys.tasks.gsm8k import extract_gsm8k_answer, gsm8k_reward
from jaxrl_sys.tasks.env import (Action, Env, EnvStep, TaskEnv, ToolEnv, call_env_factory,
                                 load_env)
from jaxrl_sys.tasks.rewards import (CountingTask, exact_match, load_reward, reward_value,
                                     score_completions)
from jaxrl_sys.tasks.search import SearchEnv, SearchTask
from jaxrl_sys.tasks.tools import Tool, ToolCall, ToolExecutor, ToolResult
from jaxrl_sys.tasks.tokenizer import CharTokenizer

TASKS = {"arithmetic": ArithmeticTask, "countdown": CountdownTask,
         "calculator": CalculatorTask, "search": SearchTask}


def make_task(name: str, reward=None, **kwargs) -> Task:
  """Builds a built-in task by name, or a `DatasetTask` from "jsonl:PATH" (also "parquet:PATH",
  "datasets:DIR") scored by `reward` (a function or "module:function"; default: exact match
  on the rows' answers). Unknown names and keys raise errors that name them."""
  if parse_task_spec(name) is not None:
    return make_dataset_task(name, reward, **kwargs)
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)} or jsonl:PATH / "
                     "parquet:PATH / datasets:DIR")
  if reward is not None:
    raise ValueError(f"task {name!r} has its own reward; --reward applies to data-set tasks "
                     "(--task=jsonl:PATH)")
  try:
    return TASKS[name](**kwargs)
  except TypeError as e:
    raise ValueError(f"bad arguments for task {name!r}: {e}") from e


__all__ = [
    "Action", "CalculatorEnv", "CalculatorTask", "Env", "EnvStep", "SearchEnv", "SearchTask",
    "TaskEnv", "Tool", "ToolCall", "ToolEnv", "ToolExecutor", "ToolResult", "call_env_factory",
    "load_env",
    "ArithmeticTask", "CharTokenizer", "CountdownTask", "CountingTask", "DatasetTask",
    "NonFiniteRewardError", "Problem", "RewardError", "RewardValueError", "SupervisedBatch",
    "TASKS", "Task", "Tokenizer", "reward_value",
    "evaluate", "exact_match", "extract_gsm8k_answer", "gsm8k_reward", "load_reward",
    "make_dataset_task", "make_task", "parse_integer_answer", "parse_task_spec", "read_rows",
    "score_completions", "supervised_examples",
]

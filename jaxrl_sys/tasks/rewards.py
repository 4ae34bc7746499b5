"""Reward functions as users bring them, and failure counting for the run's metrics.

A user reward is a plain Python function

    def score(prompt: str, completion: str, **row) -> float

(`row`: the other fields of the prompt's data row, e.g. `answer`), named on the command line
as `module:function` (`--reward=mymod:score`, the module importable from the working
directory) or `path/to/file.py:function`.

Every reward value is checked in one place, `reward_value`: a real number (bool, int, float,
a numpy scalar or 0-d array of a numeric dtype) that fits float32. Anything else (a string, even
"1.0", None, a list, 1e300) is a failed call: it scores 0, is counted in `reward_failures`, and
its type is named in the end-of-run note. NaN and infinities stop the run
(`NonFiniteRewardError`): they are bugs in the reward, not scores.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import numbers
import os
import sys
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_sys.tasks.base import (NonFiniteRewardError, Problem, RewardError, RewardValueError,
                                  Task)

log = logging.getLogger(__name__)

RewardFn = Callable[..., float]
_F32_MAX = float(np.finfo(np.float32).max)


def reward_value(value: Any, task_name: str, prompt: str, completion: str) -> float:
  """The reward as a float that fits float32 (see the module docstring).

  Raises:
    RewardValueError: not a real number, or outside float32's range (type and value named).
    NonFiniteRewardError: NaN or an infinity (prompt and completion named).
  """
  number = isinstance(value, (numbers.Real, np.bool_)) and not isinstance(value, np.ndarray)
  if not number and isinstance(value, (np.ndarray, np.generic)):
    number = np.ndim(value) == 0 and np.asarray(value).dtype.kind in "biuf"
  if not number:
    shown = repr(value)
    shown = shown[:60] + "..." if len(shown) > 60 else shown
    raise RewardValueError(f"returned {type(value).__name__} {shown}, not a number (rewards "
                           "must be int, float, bool or a numpy scalar; strings are not "
                           "converted)")
  try:
    r = float(value)
  except OverflowError:  # an int beyond float64
    raise RewardValueError(f"returned {type(value).__name__} {value!r:.60}, which does not fit "
                           "float32") from None
  if math.isnan(r) or math.isinf(r):
    raise NonFiniteRewardError(
        f"the reward function of task {task_name!r} returned {r} for prompt {prompt[:200]!r} "
        f"and completion {completion[:200]!r}; rewards must be finite numbers (return 0.0 for "
        "a failed answer)")
  if abs(r) > _F32_MAX:
    raise RewardValueError(f"returned {type(value).__name__} {r!r}, which does not fit float32 "
                           f"(|r| <= {_F32_MAX:.3g}); rewards are trained in float32")
  return r


# What a reward function may raise and still only fail that completion (scored 0, counted):
# any exception, and SystemExit (a reward that calls sys.exit() would otherwise end the run
# with its status, which may read as another error's exit code, and without a checkpoint).
# KeyboardInterrupt stays an interrupt.
REWARD_FAILURES = (Exception, SystemExit)


def score_completions(task: Task, problems: Sequence[Problem], texts: Sequence[str]
                      ) -> tuple[np.ndarray, list[RewardError]]:
  """Scores each completion; a reward call that raises or returns a non-reward scores 0.

  Failures are summarised in one warning per call (how many, and the first prompt and error);
  `CountingTask` also counts them for the run's metrics.

  Returns:
    rewards `[n]` float32 and the list of failures.

  Raises:
    NonFiniteRewardError: a reward was NaN or infinite (the message names the prompt).
  """
  if len(problems) != len(texts):
    raise ValueError(f"{len(problems)} problems but {len(texts)} completions")
  name = getattr(task, "name", type(task).__name__)
  rewards = np.zeros(len(texts), np.float32)
  errors: list[RewardError] = []
  for i, (p, t) in enumerate(zip(problems, texts)):
    try:
      rewards[i] = reward_value(task.reward(p, t), name, p.prompt, t)
    except NonFiniteRewardError:
      raise
    except REWARD_FAILURES as e:  # pylint: disable=broad-except
      errors.append(RewardError(i, p.prompt, f"{type(e).__name__}: {e}"))
  if errors:
    first = errors[0]
    log.warning("reward function of task %r failed on %d of %d completions (scored 0); first "
                "on prompt %r: %s", name, len(errors), len(texts), first.prompt[:200],
                first.message)
  return rewards, errors


def exact_match(prompt: str, completion: str, *, answer: Any = None, **row) -> float:
  """1.0 when the completion, stripped, equals the row's `answer` (stripped), else 0.0.

  The default reward of a data set whose rows carry an `answer` field.
  """
  del prompt, row
  if answer is None:
    raise ValueError("exact_match needs an 'answer' field in the data row")
  return float(completion.strip() == str(answer).strip())


def load_reward(spec: str) -> RewardFn:
  """Resolves "module:function" or "path/to/file.py:function" to the function.

  Raises:
    ValueError: as `load_object`.
  """
  return load_object(spec, "reward", "function")


def load_object(spec: str, what: str = "reward", kind: str = "function") -> Any:
  """Resolves "module:NAME" or "path/to/file.py:NAME" (`--reward`, `--env`) to the object.

  Raises:
    ValueError: naming the malformed spec, the module that cannot be imported (with its
      error), or the missing / non-callable attribute.
  """
  if not isinstance(spec, str) or spec.count(":") < 1:
    example = "mymod:score" if kind == "function" else "mymod:MyEnv"
    raise ValueError(f"bad {what} {spec!r}: expected module:{kind} (e.g. {example}) or "
                     f"path/to/file.py:{kind}")
  module_name, _, attr = spec.rpartition(":")
  if not module_name or not attr:
    raise ValueError(f"bad {what} {spec!r}: expected module:{kind}")
  if module_name.endswith(".py"):
    path = os.path.abspath(module_name)
    if not os.path.isfile(path):
      raise ValueError(f"{what} {spec!r}: no file {path}")
    name = f"_jaxrl_{what}_" + os.path.splitext(os.path.basename(path))[0]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    try:
      loader_spec.loader.exec_module(module)
    except Exception as e:
      raise ValueError(f"{what} {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from e
  else:
    if os.getcwd() not in sys.path and "" not in sys.path:
      sys.path.insert(0, os.getcwd())
    try:
      module = importlib.import_module(module_name)
    except Exception as e:
      raise ValueError(
          f"{what} {spec!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); "
          "run from the directory that holds it, add that directory to PYTHONPATH, or give "
          f"path/to/file.py:{kind}") from e
  fn = getattr(module, attr, None)
  if fn is None:
    raise ValueError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}")
  if not callable(fn):
    raise ValueError(f"{what} {spec!r}: {attr!r} is not callable")
  return fn


class CountingTask:
  """Wraps a task so that reward failures are counted (metrics), not logged per completion.

  A reward that raises or returns a non-reward (`reward_value`) scores 0.0; the first failure
  of each kind is logged once with its prompt, later ones only counted. A NaN / infinite
  reward raises `NonFiniteRewardError` naming the prompt. `problem`, `name` and other
  attributes pass through to the wrapped task.
  """

  def __init__(self, task):
    self.task = task
    self.name = getattr(task, "name", type(task).__name__)
    self.calls = self.failures = 0
    self.total_calls = self.total_failures = 0
    self.first_failure: str | None = None
    self._seen: set[str] = set()

  def __getattr__(self, item):
    if item == "task":  # not set yet (copy / unpickle): no recursion
      raise AttributeError(item)
    return getattr(self.task, item)

  def problem(self, index: int) -> Problem:
    return self.task.problem(index)

  def reward(self, problem: Problem, completion: str) -> float:
    self.calls += 1
    self.total_calls += 1
    try:
      return reward_value(self.task.reward(problem, completion), self.name, problem.prompt,
                          completion)
    except NonFiniteRewardError:
      raise
    except REWARD_FAILURES as e:  # pylint: disable=broad-except
      self.failures += 1
      self.total_failures += 1
      kind = type(e).__name__
      text = f"{kind}: {e} (prompt {problem.prompt[:200]!r}, completion {completion[:200]!r})"
      if self.first_failure is None:
        self.first_failure = text
      if kind not in self._seen:
        self._seen.add(kind)
        log.warning("reward function of task %r raised %s; scored 0, further failures are "
                    "counted in the metric reward_failures", self.name, text)
      return 0.0

  def take_counts(self) -> tuple[int, int]:
    """(failures, calls) since the previous call."""
    out = (self.failures, self.calls)
    self.failures = self.calls = 0
    return out

  def metrics_hook(self, step: int, state: Any, row: dict) -> None:
    """An `RLLoop` step hook: adds `reward_failures` and `reward_failure_frac` to the row."""
    del step, state
    failures, calls = self.take_counts()
    row["reward_failures"] = float(failures)
    row["reward_failure_frac"] = failures / max(calls, 1)

  def summary(self) -> str | None:
    """One line for the end of the run, or None when no reward call failed."""
    if not self.total_failures:
      return None
    return (f"reward function failed on {self.total_failures} of {self.total_calls} "
            f"completions (scored 0); first: {self.first_failure}")

"""Task protocol, problems, safe reward scoring and supervised warm-up data."""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, NamedTuple, Protocol, Sequence

import numpy as np

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Problem:
  """A prompt, its reference answer, and task-specific data."""
  prompt: str
  answer: str
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)


class Task(Protocol):
  """A verifiable task: problems are a pure function of an integer index (the data position)."""
  name: str

  def problem(self, index: int) -> Problem: ...

  def reward(self, problem: Problem, completion: str) -> float: ...


@dataclasses.dataclass(frozen=True)
class RewardError:
  """One failed reward call: the completion's index, its prompt, the exception as text."""
  index: int
  prompt: str
  message: str


class NonFiniteRewardError(ValueError):
  """A reward function returned NaN or an infinity (a bug in the reward, never a score)."""


def check_finite_reward(value: Any, task_name: str, prompt: str, completion: str) -> float:
  """`float(value)`, or NonFiniteRewardError naming the prompt and the completion."""
  r = float(value)
  if not math.isfinite(r):
    raise NonFiniteRewardError(
        f"the reward function of task {task_name!r} returned {r} for prompt {prompt!r} and "
        f"completion {completion!r}; rewards must be finite numbers (return 0.0 for a failed "
        "answer)")
  return r


def score_completions(task: Task, problems: Sequence[Problem], texts: Sequence[str]
                      ) -> tuple[np.ndarray, list[RewardError]]:
  """Scores each completion; a reward function that raises scores 0 (a failure).

  Failures are summarised in one warning per call (how many, and the first prompt and error);
  `tasks.rewards.CountingTask` also counts them for the run's metrics.

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
      value = task.reward(p, t)
    except NonFiniteRewardError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      errors.append(RewardError(i, p.prompt, f"{type(e).__name__}: {e}"))
      continue
    rewards[i] = check_finite_reward(value, name, p.prompt, t)
  if errors:
    first = errors[0]
    log.warning("reward function of task %r failed on %d of %d completions (scored 0); first "
                "on prompt %r: %s", name, len(errors), len(texts), first.prompt, first.message)
  return rewards, errors


class SupervisedBatch(NamedTuple):
  """tokens `[n, seq]` int32 right-padded (bos + prompt + answer + eos); attention_mask
  `[n, seq]` 1 on real tokens; loss_mask `[n, seq]` 1 on positions whose NEXT token is part of
  the answer (so `loss = -log p(tokens[:, 1:]) * loss_mask[:, :-1]`)."""
  tokens: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray


def supervised_examples(task: Task, tokenizer, start: int, count: int,
                        seq_len: int | None = None) -> SupervisedBatch:
  """Prompt + reference answer sequences for the supervised warm-up phase."""
  seqs, n_prompt = [], []
  for i in range(start, start + count):
    p = task.problem(i)
    pr = tokenizer.encode(p.prompt, bos=True)
    seqs.append(pr + tokenizer.encode(p.answer, eos=True))
    n_prompt.append(len(pr))
  t = seq_len or max(len(s) for s in seqs)
  if max(len(s) for s in seqs) > t:
    raise ValueError(f"a supervised example is longer than seq_len={t}")
  toks = np.full((count, t), tokenizer.pad_id, np.int32)
  attn = np.zeros((count, t), np.int32)
  loss = np.zeros((count, t), np.int32)
  for j, (s, k) in enumerate(zip(seqs, n_prompt)):
    toks[j, :len(s)] = s
    attn[j, :len(s)] = 1
    loss[j, k - 1:len(s) - 1] = 1
  return SupervisedBatch(toks, attn, loss)

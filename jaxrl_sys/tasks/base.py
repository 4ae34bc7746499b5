"""Task and tokenizer protocols, problems and supervised warm-up data (reward scoring:
`tasks.rewards`)."""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol, Sequence

import numpy as np


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


class Tokenizer(Protocol):
  """Text <-> token ids, as tasks, the RL loop, the evaluators and the supervised warm-up use
  them: one seam for the synthetic tasks' `CharTokenizer` and a Hugging Face model's
  `models.HFTokenizer`.

  Attributes:
    pad_id: the id packed batches are padded with.
    bos_id: the beginning-of-sequence id, or None for a model without one.
    eos_id: the end-of-sequence id (the rollout engines' stop token).
    vocab_size: every id lies in [0, vocab_size).
    uses_chat_template: prompts encoded with `bos=True` are wrapped in a chat template.
  """
  pad_id: int
  bos_id: int | None
  eos_id: int
  vocab_size: int
  uses_chat_template: bool

  def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
    """Token ids of `text`; `bos=True` marks a prompt (bos first, or the chat template);
    `eos=True` appends eos."""

  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids`, up to the first eos."""


@dataclasses.dataclass(frozen=True)
class RewardError:
  """One failed reward call: the completion's index, its prompt, the exception as text."""
  index: int
  prompt: str
  message: str


class NonFiniteRewardError(ValueError):
  """A reward function returned NaN or an infinity (a bug in the reward, never a score)."""


class RewardValueError(TypeError):
  """A reward function returned something that is not a reward: not a real number (a string,
  None, a list, ...) or a number that does not fit float32. Counted as a failed call."""


class SupervisedBatch(NamedTuple):
  """tokens `[n, seq]` int32 right-padded (bos + prompt + answer + eos); attention_mask
  `[n, seq]` 1 on real tokens; loss_mask `[n, seq]` 1 on positions whose NEXT token is part of
  the answer (so `loss = -log p(tokens[:, 1:]) * loss_mask[:, :-1]`)."""
  tokens: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray


def supervised_examples(task: Task, tokenizer, start: int, count: int,
                        seq_len: int | None = None) -> SupervisedBatch:
  """Prompt + reference answer sequences for the supervised warm-up phase (a multi-turn task
  with `demonstration(i)`: its expert episodes, trained on the policy's turns only)."""
  if hasattr(task, "demonstration"):
    return _demonstrations(task, tokenizer, start, count, seq_len)
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


def _demonstrations(task, tokenizer, start: int, count: int, seq_len: int | None
                    ) -> SupervisedBatch:
  from jaxrl_sys.tasks.turns import demonstration_ids, turn_format  # pylint: disable=import-outside-toplevel
  fmt = turn_format(tokenizer)
  demos = [demonstration_ids(fmt, task.demonstration(i)) for i in range(start, start + count)]
  t = seq_len or max(len(ids) for ids, _ in demos)
  if max(len(ids) for ids, _ in demos) > t:
    raise ValueError(f"a demonstration episode is longer than seq_len={t}")
  toks = np.full((count, t), tokenizer.pad_id, np.int32)
  attn = np.zeros((count, t), np.int32)
  loss = np.zeros((count, t), np.int32)
  for j, (ids, mask) in enumerate(demos):
    toks[j, :len(ids)] = ids
    attn[j, :len(ids)] = 1
    loss[j, :len(ids) - 1] = mask[1:]  # position p predicts token p + 1
  return SupervisedBatch(toks, attn, loss)

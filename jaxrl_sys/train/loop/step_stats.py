"""What a step's metrics row needs from its groups, as plain arrays (one process or many)."""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np


class StepStats(NamedTuple):
  """The trained groups of one step, over every process.

  Attributes:
    rewards, lengths: `[samples]` float32 rewards / int response lengths (group-major).
    stopped: `[samples]` bool, the response ended on a stop token.
    versions: `[tokens]` int, the weight version of every generated token (observation tokens
      of multi-turn episodes, version -1, left out).
    zero_variance: groups whose rewards were all equal.
    group_ids: the trained groups' prompt indices.
    trained_positions: packed positions trained (rows x row length, padding rows excluded).
  """
  rewards: np.ndarray
  lengths: np.ndarray
  stopped: np.ndarray
  versions: np.ndarray
  zero_variance: int
  group_ids: list[int]
  trained_positions: int


def step_stats(scored: Sequence, taken: Sequence, row_length: Callable[[list], int]) -> StepStats:
  """From one process's scored micro-batches (`groups.ScoredGroups`) and taken groups."""
  versions = [v[v >= 0] for g in taken for c in g.completions()
              for v in [np.asarray(c.request.versions)]]
  return StepStats(
      rewards=np.concatenate([s.rewards.reshape(-1) for s in scored]),
      lengths=np.concatenate([s.lengths.reshape(-1) for s in scored]),
      stopped=np.concatenate([s.stopped.reshape(-1) for s in scored]),
      versions=np.concatenate(versions) if versions else np.zeros((0,), np.int32),
      zero_variance=sum(s.zero_variance for s in scored),
      group_ids=[g.group_id for g in taken],
      trained_positions=sum(len(s.samples) * row_length(s.samples) for s in scored))

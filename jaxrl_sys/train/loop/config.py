"""Frozen configuration of the host RL loop (`LoopConfig`: modes, batch sizes, staleness) and
of its checkpoints (`CheckpointConfig`: the orbax manager). Each validates itself in
`__post_init__` with messages that name the bad value. The loop's rules on its settings
(`extra_groups`: APRIL over-provisioning; `check_lengths`: prompt + response within the
context) live beside them.
"""
from __future__ import annotations

import dataclasses
import math

MODES = ("sync", "one_off", "async")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Orbax checkpointing.

  Attributes:
    directory: where step directories go; None disables checkpoints (the recipe: checkpoints/
      in the run directory).
    save_every: save every N train steps (0 = only on preemption / at the end).
    keep: keep the last K checkpoints.
    async_save: let orbax write in the background.
    checksum: store a fingerprint of the state and verify it on restore.
    identity: JSON-serialisable fields that define the run (model, task, algorithm, ...);
      stored with every checkpoint, and a restore whose identity differs raises
      `CheckpointMismatchError` naming the fields (None: not recorded or compared).
  """
  directory: str | None = None
  save_every: int = 0
  keep: int = 3
  async_save: bool = True
  checksum: bool = True
  identity: dict | None = None

  def __post_init__(self):
    if self.save_every < 0:
      raise ValueError(f"checkpoint.save_every={self.save_every} must be >= 0")
    if self.keep < 1:
      raise ValueError(f"checkpoint.keep={self.keep} must be >= 1 (keep-last-K)")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """The host RL loop.

  Attributes:
    steps: number of train steps (the run stops when `state.step` reaches it).
    prompts_per_step: B, groups per train step.
    group_size: G, samples per prompt (MC-GRPO samples G + 1 and excludes the pivot).
    mode: "sync" (on-policy: every token of step k from version k), "one_off" (step k trains
      on samples generated entirely by version k - 1) or "async" (AReaL: admit new groups
      while `accepted < (max_staleness + version + 1) * B`; in-flight samples continue on new
      weights, so one sample can span versions).
    max_staleness: eta of the async mode.
    micro_batch_groups: m_b, groups per micro-batch (gradient accumulation unit).
    dynamic_micro_batching: start a micro-batch as soon as m_b groups are complete instead of
      waiting for the whole step's B groups.
    max_new_tokens: response budget per sample (None: left to the recipe, which fills in the
      task's; data sets: from the answers).
    max_prompt_len: prompt length bucket in tokens (prompts are padded to it; None: left to
      the recipe: the task's; data sets: the longest prompt, at most 4x the 99th percentile
      and 2048, and a data set's longer prompts are dropped with a note).
    temperature: sampling temperature (logprobs of the full distribution at it).
    oversample: APRIL over-provisioning factor in sync / one_off modes (>= 1): submit
      ceil(B * oversample) groups, keep the first B complete, carry the rest (partial) over.
    seed: run seed (request keys, parameter init).
    log_every: print / log every N steps.
    poll_timeout: seconds a poll may wait for completions.
    stall_timeout: seconds without any completion, while requests are pending, after which
      the run stops with an error describing the rollout state (e.g. every worker lost).
    local_workers: engines of the embedded in-process rollout, splitting its decode slots and
      generating side by side on threads of their own (`rollout.ThreadWorker`); 0 = auto: two
      on a CPU host with at least two cores when each keeps 32 slots or more, else one.
  """
  steps: int = 20
  prompts_per_step: int = 8
  group_size: int = 8
  mode: str = "sync"
  max_staleness: int = 0
  micro_batch_groups: int = 4
  dynamic_micro_batching: bool = True
  max_new_tokens: int | None = 8
  max_prompt_len: int | None = 16
  temperature: float = 1.0
  oversample: float = 1.0
  seed: int = 0
  log_every: int = 10
  poll_timeout: float = 60.0
  stall_timeout: float = 600.0
  local_workers: int = 0

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"unknown loop.mode {self.mode!r}; choose one of {MODES}")
    if self.steps < 1:
      raise ValueError(f"loop.steps={self.steps}: nothing to train; give loop.steps >= 1")
    if self.prompts_per_step < 1:
      raise ValueError(f"loop.prompts_per_step={self.prompts_per_step} must be >= 1")
    if self.micro_batch_groups < 1:
      raise ValueError(f"loop.micro_batch_groups={self.micro_batch_groups} must be >= 1")
    if self.max_staleness < 0:
      raise ValueError(f"loop.max_staleness must be >= 0, got {self.max_staleness}")
    if self.mode != "async" and self.max_staleness:
      raise ValueError(f"loop.max_staleness={self.max_staleness} needs loop.mode='async'")
    for name in ("max_new_tokens", "max_prompt_len"):
      if getattr(self, name) is not None and getattr(self, name) < 1:
        raise ValueError(f"loop.{name}={getattr(self, name)} must be >= 1")
    if not self.temperature > 0:
      raise ValueError(f"loop.temperature must be > 0 for RL sampling, got {self.temperature}")
    if self.oversample < 1:
      raise ValueError(f"loop.oversample must be >= 1, got {self.oversample}")
    if not (self.poll_timeout > 0 and self.stall_timeout > 0):
      raise ValueError("loop.poll_timeout and loop.stall_timeout must be > 0")
    if not self.log_every >= 1:
      raise ValueError(f"loop.log_every={self.log_every} must be >= 1")
    if self.local_workers < 0:
      raise ValueError(f"loop.local_workers must be >= 0 (0 = auto), got {self.local_workers}")

  @property
  def staleness(self) -> int:
    """eta of the admission rule: 0 (sync), 1 (one_off) or max_staleness (async)."""
    return {"sync": 0, "one_off": 1}.get(self.mode, self.max_staleness)

  @property
  def seq_len(self) -> int:
    """Length of the packed training sequences (prompt bucket + response budget)."""
    if self.max_prompt_len is None or self.max_new_tokens is None:
      raise ValueError("max_prompt_len and max_new_tokens are None (left to the recipe): give "
                       "both to a loop that runs without `recipe.build_recipe`")
    return self.max_prompt_len + self.max_new_tokens


def extra_groups(loop: LoopConfig) -> int:
  """Groups admitted beyond B per step: APRIL over-provisioning, ceil(B * oversample) - B in
  sync / one_off modes (async admits by staleness instead: 0)."""
  if loop.mode == "async":
    return 0
  return int(math.ceil(loop.prompts_per_step * loop.oversample)) - loop.prompts_per_step


def check_lengths(max_seq_len: int, loop: LoopConfig) -> None:
  """Raises ValueError when the prompt bucket plus the response budget exceed the context
  `max_seq_len` (the model's)."""
  if loop.seq_len > max_seq_len:
    raise ValueError(
        f"prompt longer than the context: max_prompt_len {loop.max_prompt_len} + max_new_tokens "
        f"{loop.max_new_tokens} = {loop.seq_len} > the model's max_seq_len {max_seq_len}")

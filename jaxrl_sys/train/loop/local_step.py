"""One train step of a run in one process: the step's B groups, trained as they complete.

`LocalStep.train_step` collects complete groups (oldest first; async mode leaves room for an
overdue group, see `ready`), scores them, packs them into micro-batches and accumulates their
gradients; with dynamic micro-batching a micro-batch starts as soon as m_b groups are complete.
The groups at hand go into micro-batches in group id order, whatever order they completed in.
A step of one micro-batch runs as one program (`TrainFns.fused_step`). A run over several
processes uses `process_group.ProcessGroup` instead, with the same interface (`claim`,
`train_step`), so the loop has one step whatever the layout.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from jaxrl_sys.rollout.clock import Clock
from jaxrl_sys.train.loop.buffer import Group, RolloutBuffer
from jaxrl_sys.train.loop.groups import score_groups
from jaxrl_sys.train.loop.plan import RunPlan
from jaxrl_sys.train.loop.step_stats import StepStats, step_stats
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.update import TrainFns


class StepOutcome(NamedTuple):
  """A trained step: the new state, the step's metrics (host values), the groups it trained,
  their statistics, and the seconds spent waiting for rollout and training."""
  state: Any
  metrics: dict
  taken: list[Group]
  stats: StepStats
  t_roll: float
  t_train: float


def ready(plan: RunPlan, buffer: RolloutBuffer, version: int, room: int) -> list[Group]:
  """Complete groups to train now, oldest first, at most `room`. Async: a group admitted at
  version a trains by version a + max_staleness; while such an overdue group is still
  generating (delayed by a lost worker, say), newer groups leave room for it, so the trainer
  waits for it rather than exceed the bound."""
  complete = buffer.complete_groups()
  if plan.loop.mode != "async":
    return complete[:room]
  due = version - plan.loop.max_staleness
  late = sum(1 for g in buffer.groups.values() if g.admitted_version <= due and not g.complete)
  overdue = [g for g in complete if g.admitted_version <= due][:room]
  newer = [g for g in complete if g.admitted_version > due]
  return overdue + newer[:max(room - len(overdue) - late, 0)]


class LocalStep:
  """The step of a one-process run (see the module docstring).

  Args:
    plan: the run's plan; fns: the jitted step pieces; task, tokenizer: for scoring and
      packing; clock: times the rollout waits and the training; check: called between
      micro-batches (the loop's stop-signal check).
  """

  def __init__(self, plan: RunPlan, fns: TrainFns, task, tokenizer, *, clock: Clock,
               check: Callable[[], None] = lambda: None):
    self.plan, self.fns, self.task, self.tok = plan, fns, task, tokenizer
    self.clock, self.check = clock, check

  def claim(self, group_ids: list[int]) -> list[int]:
    """The admitted groups this process generates: all of them."""
    return list(group_ids)

  def train_step(self, state, buffer: RolloutBuffer, version: int,
                 poll: Callable[[], float]) -> StepOutcome:
    """Trains the step's B groups; `poll()` files new completions into `buffer` and returns
    the seconds it waited."""
    fns, samples = self.fns, self.plan.samples_per_group
    t_roll = t_train = 0.0
    taken: list[Group] = []
    trained: list[Group] = []  # taken, in the order of the micro-batches' rows
    acc = None
    scored: list = []
    pending: list[Group] = []
    m, b = self.plan.loop.micro_batch_groups, self.plan.loop.prompts_per_step
    while len(taken) < b:
      self.check()
      got = ready(self.plan, buffer, version, b - len(taken))
      if not got:
        t_roll += poll()
        continue
      for g in got:
        taken.append(buffer.pop(g.group_id))
        pending.append(taken[-1])
      # In group id order, not the order the groups happened to complete in: the rows of a
      # micro-batch (and with them the float sums of its gradient and metrics) are the same
      # whatever the rollout's timing, so a step that trains all its groups in one micro-batch
      # (or waits for all of them: dynamic_micro_batching=False) repeats bit for bit.
      pending.sort(key=lambda g: g.group_id)
      # Dynamic micro-batching: a micro-batch starts as soon as m_b groups are complete.
      n = len(pending) if len(taken) == b else (
          len(pending) // m * m if self.plan.loop.dynamic_micro_batching else 0)
      if n:
        t0 = self.clock.now()
        layout = batch_lib.micro_batches(n, m, fns.min_groups(samples))
        trained += pending[:n]
        batches = self._micro_batches(pending[:n], layout, scored)
        pending = pending[n:]
        if acc is None and len(layout) == 1 and len(taken) == b:
          # The whole step is one micro-batch: gradient and update in one program.
          state, metrics = fns.fused_step(state, next(batches))
          metrics = jax.device_get(metrics)
          t_train += self.clock.now() - t0
          return self._outcome(state, metrics, trained, scored, t_roll, t_train)
        for mb in batches:  # each packed on the host while the previous one computes
          acc = fns.accumulate(state, fns.init_accum(state, mb) if acc is None else acc, mb)
        t_train += self.clock.now() - t0
    t0 = self.clock.now()
    state, metrics = fns.apply(state, acc)
    metrics = jax.device_get(metrics)
    t_train += self.clock.now() - t0
    return self._outcome(state, metrics, trained, scored, t_roll, t_train)

  def _outcome(self, state, metrics, taken, scored, t_roll, t_train) -> StepOutcome:
    return StepOutcome(state, metrics, taken, step_stats(scored, taken, self.plan.row_length),
                       t_roll, t_train)

  def _micro_batches(self, groups: list[Group], layout: list[tuple[int, int]], scored: list):
    """Scores `groups` and packs them into device micro-batches following `layout`
    (`batch.micro_batches`: at most m_b groups each, sized to the groups present), one at a
    time as they are consumed."""
    plan, i = self.plan, 0
    for n, padded in layout:
      chunk, i = groups[i:i + n], i + n
      sc = score_groups(chunk, self.task, self.tok, plan.train.advantage, pad_to=padded)
      scored.append(sc)
      yield self.fns.put_batch(batch_lib.pack(sc.samples, padded * plan.samples_per_group,
                                              plan.row_length(sc.samples), self.tok.pad_id,
                                              window=plan.loop.max_new_tokens,
                                              route_shape=plan.route_shape))

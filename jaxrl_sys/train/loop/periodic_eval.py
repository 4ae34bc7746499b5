"""Periodic evaluation during a run: mean reward on held-out prompts every N steps.

`PeriodicEval` is an `RLLoop` step hook: every `every` steps (and at the last step) it samples
`plan.eval_samples` completions of each held-out problem with the current parameters, through
the evaluation's rollout session (built once by the caller, weights republished each time), and
adds `eval_reward` to the step's metrics row (so it reaches metrics.jsonl, TensorBoard and the
plot). Keys and prompts are the same every time, so the curve measures the policy, not the draw.
"""
from __future__ import annotations

from typing import Any, Sequence

from jaxrl_sys.rollout.types import RolloutSession
from jaxrl_sys.train.loop.evaluate import evaluate
from jaxrl_sys.train.loop.plan import RunPlan

# Problem indices of the held-out set of a synthetic task (training uses 0, 1, ...; the
# supervised warm-up starts at 1_000_000).
SYNTHETIC_EVAL_START = 2_000_000


class PeriodicEval:
  """See the module docstring.

  Args:
    client: the evaluation's rollout session (its builder closes it).
    task, tokenizer: the held-out task and its tokenizer.
    indices: problem indices of the held-out set.
    plan: the run's plan (sampling settings, completions per problem, the run's last step).
    every: evaluate when `step % every == 0` (0 disables), and at `plan.loop.steps`.
    seed: sampling seed of the evaluation requests.
    progress: optional `metrics_log.Progress` for the phase label.
  """

  def __init__(self, client: RolloutSession, task, tokenizer, indices: Sequence[int], *,
               plan: RunPlan, every: int, seed: int = 1234, progress=None):
    if every < 0:
      raise ValueError(f"PeriodicEval: every must be >= 0 (0 = off), got {every}")
    self.client, self.task, self.tok, self.plan = client, task, tokenizer, plan
    self.indices = [int(i) for i in indices]
    self.every, self.seed, self.progress = every, seed, progress

  def due(self, step: int) -> bool:
    return bool(self.every) and (step % self.every == 0 or step == self.plan.loop.steps)

  def __call__(self, step: int, state: Any, row: dict) -> None:
    if not self.due(step):
      return
    if self.progress is not None:
      self.progress.phase(f"evaluating ({len(self.indices)} prompts)")
    row["eval_reward"] = evaluate(self.client, state.params, self.task, self.tok, self.indices,
                                  plan=self.plan, seed=self.seed, moe_state=state.moe_state,
                                  version=step)

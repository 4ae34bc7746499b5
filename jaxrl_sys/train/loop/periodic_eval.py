"""Periodic evaluation during a run: mean reward on held-out prompts every N steps.

`PeriodicEval` is an `RLLoop` step hook: every `every` steps (and at the last step) it samples
`samples` completions of each held-out problem with the current parameters, through its own
in-process rollout client (created once, weights republished each time), and adds
`eval_reward` to the step's metrics row (so it reaches metrics.jsonl, TensorBoard and the plot).
Keys and prompts are the same every time, so the curve measures the policy, not the draw.
"""
from __future__ import annotations

from typing import Any, Sequence

from jaxrl_sys.models import ModelConfig
from jaxrl_sys.train.loop.config import LoopConfig
from jaxrl_sys.train.loop.evaluate import evaluate
from jaxrl_sys.train.loop.plan import default_engine_config, embedded_client

# Problem indices of the held-out set of a synthetic task (training uses 0, 1, ...; the
# supervised warm-up starts at 1_000_000).
SYNTHETIC_EVAL_START = 2_000_000


class PeriodicEval:
  """See the module docstring.

  Args:
    model_config: the model.
    task, tokenizer: the held-out task and its tokenizer.
    indices: problem indices of the held-out set.
    loop_config: sampling settings and engine size (as in training).
    every: evaluate when `step % every == 0` (0 disables), and at `loop_config.steps`.
    samples: completions per problem.
    seed: sampling seed of the evaluation requests.
    progress: optional `metrics_log.Progress` for the phase label.
  """

  def __init__(self, model_config: ModelConfig, task, tokenizer, indices: Sequence[int], *,
               loop_config: LoopConfig, every: int, samples: int = 4, seed: int = 1234,
               progress=None):
    if every < 0:
      raise ValueError(f"--eval_every must be >= 0, got {every}")
    self.mc, self.task, self.tok = model_config, task, tokenizer
    self.indices = [int(i) for i in indices]
    self.lc, self.every, self.samples, self.seed = loop_config, every, samples, seed
    self.progress = progress
    self._client = None

  def close(self) -> None:
    """Ends the evaluation client (its worker and weight store), if one was started."""
    close = getattr(self._client, "close", None)
    if callable(close):
      close()
    self._client = None

  def due(self, step: int) -> bool:
    return bool(self.every) and (step % self.every == 0 or step == self.lc.steps)

  def __call__(self, step: int, state: Any, row: dict) -> None:
    if not self.due(step):
      return
    if self.progress is not None:
      self.progress.phase(f"evaluating ({len(self.indices)} prompts)")
    if self._client is None:
      # Version 0 here; each evaluation publishes the (newer) step as the version.
      ec = default_engine_config(self.lc, self.samples, self.tok.eos_id)
      self._client = embedded_client(self.mc, ec, self.lc)
      self._client.publish(state.params, 0, state.moe_state)
    row["eval_reward"] = evaluate(state.params, self.mc, self.task, self.tok, self.indices,
                                  loop_config=self.lc, samples=self.samples, seed=self.seed,
                                  client=self._client, moe_state=state.moe_state,
                                  version=step)

"""Reward of a policy on a fixed set of problems (same prompts and sampling keys every call),
so that changes between calls measure the policy, not the data mix.

Generation goes through a rollout session like training's (the recipe builds it once, with the
engines of `RunPlan.eval_engine`), so evaluation adds no separately compiled programs.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.rollout.types import RolloutSession
from jaxrl_sys.tasks import score_completions
from jaxrl_sys.train.loop.groups import group_requests
from jaxrl_sys.train.loop.plan import RunPlan

_EVAL_GROUP_OFFSET = 1 << 24  # request ids far from the training ones (keys differ too)


def evaluate(client: RolloutSession, params: Any, task, tokenizer, indices: Sequence[int], *,
             plan: RunPlan, samples: int | None = None, seed: int = 0, moe_state: Any = None,
             version: int = 0) -> float:
  """Mean reward over `samples` completions of each problem in `indices`.

  Args:
    client: the evaluation's rollout session; `params` are published to it as `version`.
    params: policy parameters.
    task, tokenizer: the task and its tokenizer.
    indices: problem indices (data positions) to evaluate on.
    plan: the run's plan (response budget, prompt bucket, poll timeout).
    samples: completions per problem (None: `plan.eval_samples`).
    seed: seeds the per-completion keys (fixed -> the same draws every call).
    moe_state: the policy's MoE balancing state (MoE models; None = zeros).
    version: the weight version published to the client (each call on one session needs a
      newer one).

  Returns:
    The mean reward in [0, 1].
  """
  params = jax.tree.map(jnp.copy, params)
  moe_state = None if moe_state is None else jax.tree.map(jnp.copy, moe_state)
  client.publish(params, version, moe_state)
  loop = plan.loop
  samples = plan.eval_samples if samples is None else samples
  indices = [int(i) for i in indices]
  gids = [_EVAL_GROUP_OFFSET + k for k in range(len(indices))]
  reqs = group_requests(task, tokenizer, gids, samples, seed=seed,
                        max_new_tokens=loop.max_new_tokens, max_prompt_len=loop.max_prompt_len,
                        problem_ids=indices)
  by_id = {r.request_id: r for r in reqs}
  client.submit(reqs)
  done = {}
  while len(done) < len(reqs):
    for c in client.poll(min_count=len(reqs) - len(done), timeout=loop.poll_timeout):
      done[c.request_id] = c
    if not client.num_pending() and len(done) < len(reqs):
      raise RuntimeError("evaluation stalled")
  ids = sorted(by_id)
  episodes = [done[i].request.meta.get("episode") for i in ids]
  if all(e is not None for e in episodes):  # multi-turn episodes: the env's rewards
    return float(np.mean([e["reward"] for e in episodes]))
  problems = [task.problem(by_id[i].meta["problem"]) for i in ids]
  texts = [tokenizer.decode(done[i].request.tokens) for i in ids]
  rewards, _ = score_completions(task, problems, texts)
  return float(np.mean(rewards))

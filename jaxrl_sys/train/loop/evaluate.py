"""Reward of a policy on a fixed set of problems (same prompts and sampling keys every call),
so that changes between calls measure the policy, not the data mix.

Generation goes through the same rollout path as training (the in-process engine, sized like
the loop's by `plan.default_engine_config`), so evaluation adds no separately compiled programs.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models import ModelConfig
from jaxrl_sys.tasks import score_completions
from jaxrl_sys.train.loop.config import LoopConfig
from jaxrl_sys.train.loop.groups import group_requests
from jaxrl_sys.train.loop.plan import default_engine_config, embedded_client

_EVAL_GROUP_OFFSET = 1 << 24  # request ids far from the training ones (keys differ too)


def evaluate(params: Any, config: ModelConfig, task, tokenizer, indices: Sequence[int], *,
             loop_config: LoopConfig, samples: int = 4, seed: int = 0, client=None,
             moe_state: Any = None, version: int = 0) -> float:
  """Mean reward over `samples` completions of each problem in `indices`.

  Args:
    params: policy parameters.
    config: model config.
    task, tokenizer: the task and its tokenizer.
    indices: problem indices (data positions) to evaluate on.
    loop_config: gives the sampling temperature, budgets and the engine's size.
    samples: completions per problem.
    seed: seeds the per-completion keys (fixed -> the same draws every call).
    client: a RolloutClient to use instead of a fresh in-process engine (its weights are
      replaced by `params`).
    moe_state: the policy's MoE balancing state (MoE models; None = zeros).
    version: the weight version published to the client (a reused client needs a newer one
      each call).

  Returns:
    The mean reward in [0, 1].
  """
  params = jax.tree.map(jnp.copy, params)
  moe_state = None if moe_state is None else jax.tree.map(jnp.copy, moe_state)
  if client is not None:
    client.publish(params, version, moe_state)
    return _evaluate(client, task, tokenizer, indices, loop_config, samples, seed)
  own = embedded_client(config, default_engine_config(loop_config, samples, tokenizer.eos_id),
                        loop_config)
  own.publish(params, version, moe_state)
  try:
    return _evaluate(own, task, tokenizer, indices, loop_config, samples, seed)
  finally:
    own.close()  # its in-process workers' threads end here, not at interpreter exit


def _evaluate(client, task, tokenizer, indices, loop_config, samples, seed) -> float:
  indices = [int(i) for i in indices]
  gids = [_EVAL_GROUP_OFFSET + k for k in range(len(indices))]
  reqs = group_requests(task, tokenizer, gids, samples, seed=seed,
                        max_new_tokens=loop_config.max_new_tokens,
                        max_prompt_len=loop_config.max_prompt_len, problem_ids=indices)
  by_id = {r.request_id: r for r in reqs}
  client.submit(reqs)
  done = {}
  while len(done) < len(reqs):
    for c in client.poll(min_count=len(reqs) - len(done), timeout=loop_config.poll_timeout):
      done[c.request_id] = c
    if not client.num_pending() and len(done) < len(reqs):
      raise RuntimeError("evaluation stalled")
  ids = sorted(by_id)
  problems = [task.problem(by_id[i].meta["problem"]) for i in ids]
  texts = [tokenizer.decode(done[i].request.tokens) for i in ids]
  rewards, _ = score_completions(task, problems, texts)
  return float(np.mean(rewards))

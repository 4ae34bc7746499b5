"""Prompts -> requests, and finished groups -> rewards -> advantages -> packable samples.

Host-side helpers of the loop (no side effects beyond reward-function warnings). A group's id
is its prompt's data index; sample j of group g is request `g * S + j` with the key
`rollout.types.request_key(seed, g * S + j)` (computed for many requests in one call).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import numpy as np

from jaxrl_sys.losses.advantages import group_advantages
from jaxrl_sys.losses.config import AdvantageConfig
from jaxrl_sys.rollout.types import FinishReason, Request
from jaxrl_sys.tasks import score_completions
from jaxrl_sys.train.step.batch import Sample
from jaxrl_sys.train.loop.buffer import Group


def encode_prompt(tokenizer, text: str, max_prompt_len: int) -> np.ndarray:
  """bos + prompt tokens; raises ValueError when longer than the prompt bucket."""
  ids = np.asarray(tokenizer.encode(text, bos=True), np.int32)
  if len(ids) > max_prompt_len:
    templated = " with the model's chat template applied (--nochat_template feeds the raw " \
        "text)" if tokenizer.uses_chat_template else ""
    raise ValueError(f"prompt longer than the context: {text!r} has {len(ids)} tokens"
                     f"{templated} but max_prompt_len={max_prompt_len} (raise --max_prompt_len, "
                     "within the model's max_seq_len minus max_new_tokens)")
  return ids


@jax.jit
def _fold_in_many(seed, ids):
  return jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(ids)


def request_keys(seed: int, request_ids: Sequence[int]) -> np.ndarray:
  """`rollout.types.request_key(seed, i)` for many ids in one device call -> uint32 `[n, 2]`."""
  ids = np.asarray(request_ids, np.uint32).reshape(-1)
  if ids.size == 0:
    return np.zeros((0, 2), np.uint32)
  return np.asarray(_fold_in_many(np.uint32(seed), ids), np.uint32)


def group_requests(task, tokenizer, group_ids: Sequence[int], samples: int, *, seed: int,
                   max_new_tokens: int, max_prompt_len: int, min_version: int = -1,
                   problem_ids: Sequence[int] | None = None) -> list[Request]:
  """The `samples` requests of each prompt in `group_ids` (deterministic in seed and ids).

  The prompt of group g is `task.problem(g)`, or `task.problem(problem_ids[i])` when given.
  """
  group_ids = [int(g) for g in group_ids]
  problem_ids = group_ids if problem_ids is None else [int(p) for p in problem_ids]
  keys = request_keys(seed, [g * samples + j for g in group_ids for j in range(samples)])
  out = []
  for gi, gid in enumerate(group_ids):
    prompt = encode_prompt(tokenizer, task.problem(problem_ids[gi]).prompt, max_prompt_len)
    for j in range(samples):
      out.append(Request(gid * samples + j, prompt, max_new_tokens, keys[gi * samples + j],
                         group_id=gid, min_version=min_version,
                         meta={"group": gid, "sample": j, "problem": problem_ids[gi]}))
  return out


@functools.partial(jax.jit, static_argnames=("config",))
def _advantages(rewards, config: AdvantageConfig):
  out = group_advantages(rewards, config=config)
  return out.advantages, out.mask, out.aux["zero_variance_groups"]


class ScoredGroups(NamedTuple):
  """samples: one `Sample` per completion (group-major); rewards `[groups, S]`;
  lengths `[groups, S]` response lengths; stopped `[groups, S]` bool (ended on a stop token);
  zero_variance: number of groups whose rewards were all equal."""
  samples: list[Sample]
  rewards: np.ndarray
  lengths: np.ndarray
  stopped: np.ndarray
  zero_variance: int


def score_groups(groups: Sequence[Group], task, tokenizer, config: AdvantageConfig, *,
                 pad_to: int | None = None) -> ScoredGroups:
  """Decodes, scores (failures score 0 with a warning) and computes group advantages.

  Completions of multi-turn episodes (`meta["episode"]`) are scored by their episodes'
  rewards; their samples carry the loss mask of the sampled tokens (`versions >= 0`).

  `pad_to`: compute the advantages on `[pad_to, S]` (constant rewards in the extra groups) so
  a varying number of groups per micro-batch does not recompile.
  """
  comps = [c for g in groups for c in g.completions()]
  episodes = [c.request.meta.get("episode") for c in comps]
  if all(e is not None for e in episodes) and episodes:
    # Multi-turn episodes (`agents.EpisodeDriver`): the env's rewards, the mask of sampled
    # tokens, and no gradient from a truncated or failed episode.
    rewards = np.array([e["reward"] for e in episodes], np.float32)
  else:
    episodes = [None] * len(comps)
    problems = [p for g in groups for p in [task.problem(g.group_id)] * g.size]
    texts = [tokenizer.decode(c.request.tokens) for c in comps]
    rewards, _ = score_completions(task, problems, texts)
  s = groups[0].size
  rewards = rewards.reshape(len(groups), s)
  extra = max((pad_to or 0) - len(groups), 0)
  padded = np.concatenate([rewards, np.zeros((extra, s), np.float32)]) if extra else rewards
  adv, mask, nzv = jax.device_get(_advantages(padded, config))
  adv, mask, nzv = adv[:len(groups)], mask[:len(groups)], int(nzv) - extra
  samples = []
  for i, (c, ep) in enumerate(zip(comps, episodes)):
    r = c.request
    weight = float(mask.reshape(-1)[i]) * (1.0 if ep is None else float(ep.get("weight", 1.0)))
    samples.append(Sample(r.prompt, r.tokens, r.logprobs, r.versions,
                          float(adv.reshape(-1)[i]), weight, r.routes,
                          None if ep is None else (r.versions >= 0).astype(np.float32)))
  lengths = np.array([c.request.num_generated for c in comps]).reshape(len(groups), s)
  stopped = np.array([c.finish == FinishReason.STOP for c in comps]).reshape(len(groups), s)
  return ScoredGroups(samples, rewards, lengths, stopped, int(nzv))

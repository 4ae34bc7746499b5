"""Shared pieces of the episode tests on real engines: one tiny model, one engine config with a
single bucket per shape (four compiled programs, shared by every test of a process), a
character tokenizer, and an env whose turns do not depend on what the policy writes."""
import functools

import jax
import numpy as np

from jaxrl_sys import models
from jaxrl_sys.rollout import EngineConfig, InProcessWorker, RolloutManager
from jaxrl_sys.tasks import CharTokenizer, SearchTask
from jaxrl_sys.tasks.env import EnvStep
from jaxrl_sys.train.recipe.presets import MATH_CHARS

TASK = SearchTask(num_entities=32, hops=1, seed=5)
TOK = CharTokenizer(MATH_CHARS + "".join(sorted(set("abcdefghijklmnopqrstuvwxyz?<>\n")
                                                - set(MATH_CHARS))))
CFG = models.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                         num_kv_heads=1, head_dim=16, intermediate_size=64, max_seq_len=64)
BUDGET = 44          # tokens per episode after its prompt (prompts are at most 20)
TURN_TOKENS = 6      # tokens per policy turn


def engine_config(**kw) -> EngineConfig:
  base = dict(num_slots=16, max_len=64, prefill_buckets=(64,), prefill_batch_buckets=(8,),
              decode_row_buckets=(16,), decode_len_buckets=(64,), stream_every=4,
              extend_prefixes=True,
              sampling=models.SamplingConfig(temperature=1.0, stop_tokens=(TOK.eos_id,)))
  base.update(kw)
  return EngineConfig(**base)


@functools.lru_cache(maxsize=None)
def params(seed: int = 0):
  return models.init_params(CFG, jax.random.PRNGKey(seed))


def session(**engine_kw) -> RolloutManager:
  """The embedded rollout session: a manager over one in-process engine, weights published."""
  m = RolloutManager([InProcessWorker("local-0", CFG, engine_config(**engine_kw))])
  m.publish(params(), 0)
  return m


class EchoEnv:
  """Three turns whatever the policy writes: observations "turn 1", "turn 2"; reward 1 per
  action of odd length."""

  def reset(self, problem):
    self.n = 0
    return problem.prompt

  def step(self, action):
    self.n += 1
    done = self.n >= 3
    return EnvStep(None if done else f"turn {self.n}", float(len(action.text) % 2), done)

  def snapshot(self):
    return {"n": self.n}

  def restore(self, problem, snapshot):
    self.n = snapshot["n"]


def assert_same_episodes(out: dict, undisturbed: dict) -> None:
  """Every episode of `out` ({id: Completion}) equals the undisturbed run's: tokens, per-token
  versions, log-probs (1e-5) and the episode record."""
  assert sorted(out) == sorted(undisturbed)
  for e, c in undisturbed.items():
    np.testing.assert_array_equal(out[e].request.tokens, c.request.tokens)
    np.testing.assert_array_equal(out[e].request.versions, c.request.versions)
    np.testing.assert_allclose(out[e].request.logprobs, c.request.logprobs, atol=1e-5)
    assert out[e].request.meta["episode"] == c.request.meta["episode"]

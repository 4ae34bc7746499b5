"""The rollout engine with LoRA adapters: unmerged, its sampled tokens' log-probs equal the
trainer's (`train.step.token_logprobs` on the same sequences, float32, 1e-5); a new version
swaps the adapters only. The merged bfloat16 engine's difference is measured by
`benchmarks/lora.py` (and the merge's rounding by tests/models/test_lora.py)."""
import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_sys import models
from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import LoraConfig
from jaxrl_sys.rollout.engine.engine import Engine
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.step.logprobs import token_logprobs
from tests.rollout.common import CFG, engine_config, make_requests, params

LORA_CFG = dataclasses.replace(CFG, lora=LoraConfig(rank=4, alpha=8.0))
PLAIN = models.SamplingConfig(temperature=1.0)
ROWS, SEQ = 8, 24


def _adapters(seed=1, std=0.1):
  ad = lora_lib.init_lora(LORA_CFG, jax.random.key(seed))
  leaves, treedef = jax.tree.flatten(ad)
  keys = jax.random.split(jax.random.key(seed + 10), len(leaves))
  return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape)
                                      for x, k in zip(leaves, keys)])


def _generate(engine, reqs):
  engine.submit(reqs)
  done = {c.request.request_id: c.request for c in engine.run()}
  return [done[r.request_id] for r in reqs]


@jax.jit
def _trainer_logprobs(base, ad, batch):
  return token_logprobs(base, LORA_CFG, TrainConfig(), batch, None, PLAIN, lora=ad)[0]


def _check_against_trainer(base, ad, done):
  """max |engine log-prob - trainer log-prob| over the sampled tokens (trainer: float32)."""
  samples = [batch_lib.Sample(r.prompt.astype(np.int32), np.asarray(r.tokens, np.int32),
                              np.asarray(r.logprobs, np.float32),
                              np.zeros(len(r.tokens), np.int32), 0.0) for r in done]
  batch = batch_lib.pack(samples, ROWS, SEQ)
  lp = np.asarray(_trainer_logprobs(base, ad, batch))
  mask = np.asarray(batch.loss_mask) > 0
  return np.abs(lp[mask] - np.asarray(batch.behav_logprobs)[mask]).max(), int(mask.sum())


def test_unmerged_engine_logprobs_equal_the_trainers():
  base, ad = params(0), _adapters()
  engine = Engine(LORA_CFG, ad, engine_config(PLAIN), base=base)
  done = _generate(engine, make_requests(ROWS, seed=3))
  diff, n = _check_against_trainer(base, ad, done)
  assert n > 20 and diff < 1e-5, diff
  # A new version swaps the adapters only (B = 0: the base's policy); the same request keys
  # now sample other tokens, whose log-probs are again the trainer's.
  zero = jax.tree_util.tree_map_with_path(lambda p, x: x * 0 if p[-1].key == "b" else x, ad)
  engine.load(zero, 1)
  again = _generate(engine, make_requests(ROWS, seed=3))
  assert engine.base is base and engine.version == 1
  assert any(not np.array_equal(a.tokens, b.tokens) for a, b in zip(done, again))
  diff, _ = _check_against_trainer(base, zero, again)
  assert diff < 1e-5, diff


def test_engine_needs_the_base_for_a_lora_model():
  base, ad = params(0), _adapters()
  with pytest.raises(ValueError, match="frozen base"):
    Engine(LORA_CFG, ad, engine_config(PLAIN))
  with pytest.raises(ValueError, match="do not fit"):
    Engine(LORA_CFG, base, engine_config(PLAIN), base=base)  # the base given as adapters


def test_a_next_turn_extends_the_kept_prefix_with_the_adapters():
  """Multi-turn prefix extension (`extend_prefixes`, `slots.extend`) runs the adapters too:
  second turns that extend the first turns' kept rows sample log-probs equal to the trainer's
  on the whole sequence (float32, 1e-5)."""
  from jaxrl_sys.rollout.types import Request  # pylint: disable=import-outside-toplevel
  from tests.rollout.common import request_key  # pylint: disable=import-outside-toplevel

  base, ad = params(0), _adapters()
  engine = Engine(LORA_CFG, ad, engine_config(PLAIN, extend_prefixes=True), base=base)
  rng = np.random.default_rng(5)
  first = [Request(i, rng.integers(1, CFG.vocab_size, size=4), 6, request_key(7, i))
           for i in range(3)]
  done = _generate(engine, first)
  second = [Request(10 + r.request_id, np.concatenate([r.prompt, r.tokens, [5, 6]]), 4,
                    request_key(7, 10 + r.request_id)) for r in done]
  again = _generate(engine, second)
  assert engine.stats.extend_calls > 0 and engine.stats.reused_tokens > 0
  diff, n = _check_against_trainer(base, ad, again)
  assert n >= 6 and diff < 1e-5, diff

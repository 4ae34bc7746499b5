"""Multi-turn episodes of an MoE policy (BIP balancing with a capacity limit): extending the
previous turn's KV (`EngineConfig.extend_prefixes`) and re-prefilling the whole context give the
same episodes, token for token, with the same routes; the routes are those a full forward with
per-token routing picks; and the trainer's forward replaying them (R3) reproduces the rollout's
log-probs at every sampled position. References: the run without extension, a plain forward
over the finished sequence, the training forward."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys import models
from jaxrl_sys.agents import AgentConfig, EpisodeDriver
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.rollout import InProcessWorker, RolloutManager
from jaxrl_sys.tasks.turns import PlainFormat
from jaxrl_sys.train.loop.groups import group_requests
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.step.update import batch_routes, token_logprobs
from tests.agents import common
from tests.agents.scripted import run_all

CFG = dataclasses.replace(common.CFG, moe=models.MoEConfig(
    num_experts=4, num_experts_per_tok=2, expert_intermediate_size=16, balancing="bip",
    capacity_factor=1.0))


def _policy():
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  params = jax.tree.map(lambda x: x * 3.0 if x.ndim > 1 else x, params)   # a decisive router
  q = jnp.abs(jax.random.normal(jax.random.PRNGKey(5), (CFG.num_layers, 4))) * 0.05
  return params, moe.init_moe_state(CFG)._replace(q=q)


@pytest.fixture(scope="module")
def runs():
  params, state = _policy()
  reqs = group_requests(common.TASK, common.TOK, range(2), 1, seed=3,
                        max_new_tokens=common.BUDGET, max_prompt_len=20)
  out = {}
  for extend in (True, False):
    worker = InProcessWorker("w", CFG, common.engine_config(
        num_slots=4, decode_row_buckets=(4,), prefill_batch_buckets=(4,),
        extend_prefixes=extend))
    m = RolloutManager([worker])
    m.publish(params, 0, state)
    driver = EpisodeDriver(m, common.EchoEnv, common.TASK, PlainFormat(common.TOK),
                           AgentConfig(max_turns=3, max_turn_tokens=common.TURN_TOKENS,
                                       check_template=False))
    out[extend] = (run_all(driver, reqs), worker.engine.stats)
    driver.close()
    m.close()
  return params, state, out


def test_extension_changes_no_token_logprob_or_route(runs):
  params, state, out = runs
  (on, on_stats), (off, off_stats) = out[True], out[False]
  assert on_stats.extend_calls > 0 and on_stats.reused_tokens > 0
  assert off_stats.reused_tokens == 0
  assert sorted(on) == sorted(off)
  for e, c in on.items():
    r, ref = c.request, off[e].request
    mask = r.versions >= 0
    # several turns, with observation tokens between the sampled ones
    assert r.meta["episode"]["turns"] >= 2 and (~mask[:np.flatnonzero(mask)[-1]]).any()
    np.testing.assert_array_equal(r.tokens, ref.tokens)
    np.testing.assert_array_equal(r.versions, ref.versions)
    np.testing.assert_allclose(r.logprobs, ref.logprobs, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(r.routes, ref.routes)
    # Every position up to the one that sampled the last token is routed (the observation
    # after the last turn, never fed, is not).
    lp, lr = len(r.prompt), len(r.tokens)
    assert lp + np.flatnonzero(mask)[-1] <= r.num_routed <= lp + lr - 1
    # The experts a full forward with per-token routing picks at every routed position.
    seq = np.concatenate([r.prompt, r.tokens])[None, :r.num_routed]
    want = models.forward(params, CFG, jnp.asarray(seq), moe_state=state, per_token_routing=True,
                          return_routes=True).routes.experts[0]
    np.testing.assert_array_equal(np.sort(r.routes, -1), np.sort(np.asarray(want), -1))


def test_trainer_replay_reproduces_the_episode_logprobs(runs):
  params, state, out = runs
  eps = [c.request for c in out[True][0].values()]
  samples = [batch_lib.Sample(r.prompt, r.tokens, r.logprobs, r.versions, 1.0, 1.0, r.routes,
                              mask=(r.versions >= 0).astype(np.float32)) for r in eps]
  b = batch_lib.pack(samples, len(samples), 64, common.TOK.pad_id, window=common.BUDGET,
                     route_shape=(CFG.num_layers, 2, np.uint8))
  tc = TrainConfig(routing_replay="R3")
  lp = jax.jit(lambda p, b: token_logprobs(p, CFG, tc, b, state,
                                           routes=batch_routes(CFG, tc, b))[0])(params, b)
  m = b.loss_mask > 0
  assert m.sum() > 0 and b.route_mask.sum() > 0
  np.testing.assert_allclose(np.asarray(lp)[m], b.behav_logprobs[m], atol=1e-5, rtol=0)

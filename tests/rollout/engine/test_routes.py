"""MoE routes in the rollout engine: batch-independent decode, routes returned per token, the
trainer's replay of them, and abort / resume on another engine.

The policy balances with BIP and a capacity limit, which route a batch as a whole (a request's
experts would depend on its batch-mates). References: each request run alone; a full forward
over the finished sequence with per-token routing (the routes); the training forward with and
without the recorded routes (the log-probs); an undisturbed run (resume).
"""
import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys import models
from jaxrl_sys.losses.mismatch import mismatch_stats
from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.rollout import (EngineConfig, ManagerConfig, Request, RolloutManager,
                               ThreadWorker, request_key)
from jaxrl_sys.rollout.types import TokenChunk
from jaxrl_sys.rollout.engine.engine import Engine
from jaxrl_sys.rollout.wire import request_from_json, request_to_json
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import TrainConfig
from tests.models.test_moe_replay import CFG

ENGINE = EngineConfig(num_slots=8, max_len=32, prefill_buckets=(16,), prefill_batch_buckets=(8,),
                      decode_row_buckets=(8,), decode_len_buckets=(32,), stream_every=4,
                      sampling=models.SamplingConfig(temperature=1.0))
ROW = 24   # packed row length of the training references


@pytest.fixture(scope="module")
def policy():
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  params = jax.tree.map(lambda x: x * 3.0 if x.ndim > 1 else x, params)   # a decisive router
  q = jnp.abs(jax.random.normal(jax.random.PRNGKey(5), (CFG.num_layers, 4))) * 0.05
  return params, moe.init_moe_state(CFG)._replace(q=q)


def _requests():
  rng = np.random.default_rng(7)
  out = []
  for i in range(8):   # four prompts, two samples each (shared-prompt prefill)
    if i % 2 == 0:
      prompt = rng.integers(1, 48, size=int(rng.integers(2, 10)))
    out.append(Request(i, prompt, 10, request_key(3, i), group_id=i // 2))
  return out


def _drain(client):
  out = {}
  while client.num_pending():
    for c in client.poll(min_count=1, timeout=60.0):
      out[c.request_id] = c.request
  return out


def _engine_run(params, state, reqs):
  engine = Engine(CFG, params, ENGINE, moe_state=state)
  engine.submit(reqs)
  return {c.request_id: c.request for c in engine.run()}


@jax.jit
def _per_token_routes(params, state, tokens, mask):
  return models.forward(params, CFG, tokens, attention_mask=mask, moe_state=state,
                        per_token_routing=True, return_routes=True).routes.experts


def _train_logprobs(params, state, reqs, replay):
  from jaxrl_sys.train.step.update import batch_routes, token_logprobs
  samples = [batch_lib.Sample(r.prompt, r.tokens, r.logprobs, r.versions, 0.0, 1.0, r.routes)
             for r in reqs]
  b = batch_lib.pack(samples, 8, ROW, window=10, route_shape=(2, 2, np.uint8))
  tc = TrainConfig(routing_replay="R3" if replay else "off")
  lp = jax.jit(lambda p, b: token_logprobs(p, CFG, tc, b, state,
                                           routes=batch_routes(CFG, tc, b))[0])(
      params, b)
  return mismatch_stats(lp, b.behav_logprobs, b.loss_mask)


def test_tokens_and_routes_do_not_depend_on_the_batch_and_replay_reproduces_logprobs(policy):
  params, state = policy
  reqs = _requests()
  together = _engine_run(params, state, reqs)
  for r in reqs:
    alone = _engine_run(params, state, [r])[r.request_id]
    got = together[r.request_id]
    np.testing.assert_array_equal(alone.tokens, got.tokens)
    np.testing.assert_array_equal(alone.routes, got.routes)
    np.testing.assert_allclose(alone.logprobs, got.logprobs, atol=1e-6)
  # The routes: one per fed position, uint8, as a full forward with per-token routing picks them.
  toks, mask = np.zeros((8, ROW), np.int32), np.zeros((8, ROW), np.int32)
  for i, r in enumerate(reqs):
    seq = np.concatenate([r.prompt, together[i].tokens])[:-1]
    toks[i, :len(seq)], mask[i, :len(seq)] = seq, 1
    assert together[i].routes.dtype == np.uint8
    assert together[i].routes.shape == (len(seq), CFG.num_layers, 2)
  want = np.asarray(_per_token_routes(params, state, toks, mask))
  for i, r in enumerate(together.values()):
    np.testing.assert_array_equal(np.sort(r.routes, -1), np.sort(want[i, :len(r.routes)], -1))
  # Training on these samples: with the rollout's routes replayed (R3) the trainer's log-probs
  # are the engine's; routed live (BIP over the training batch), they are not.
  r3 = _train_logprobs(params, state, list(together.values()), True)
  off = _train_logprobs(params, state, list(together.values()), False)
  assert float(r3["mismatch_max"]) < 1e-5
  assert float(off["mismatch_max"]) > 1e-2 and float(off["mismatch_mean"]) > 1e-4


def test_two_thread_workers_generate_what_one_engine_does(policy):
  params, state = policy
  ref = _engine_run(params, state, _requests())
  ws = [ThreadWorker(f"t{i}", CFG, ENGINE) for i in range(2)]
  m = RolloutManager(ws, config=ManagerConfig(theta=1, plateau_batch=3))
  m.publish(params, 1, state)
  m.submit(_requests())
  got = _drain(m)
  m.close()
  assert {m.fleet.provenance(rid)[0][0] for rid in got} == {"t0", "t1"}
  for rid, r in ref.items():
    np.testing.assert_array_equal(got[rid].tokens, r.tokens)
    np.testing.assert_array_equal(got[rid].routes, r.routes)   # rebuilt from the chunks


def _slot_of(engine, rid):
  return next(s for s in range(engine.config.num_slots)
              if engine._req[s] is not None and engine._req[s].request_id == rid)  # pylint: disable=protected-access


def test_abort_and_resume_elsewhere_keeps_routes_and_rebuilds_the_kv(policy):
  params, state = policy
  reqs = _requests()
  ref = _engine_run(params, state, reqs)
  a = Engine(CFG, params, ENGINE, moe_state=state)
  a.submit(reqs)
  a.step()                                     # four tokens each
  prefix = {r.request_id: np.asarray(a.cache.k[:, _slot_of(a, r.request_id)]) for r in reqs}
  partial = {r.request_id: r for r in a.abort()}
  for r in partial.values():                   # one route per fed position, nothing more
    assert r.num_generated == 4 and r.num_routed == len(r.prompt) + 3
  # Resumed on an engine with the same policy: the undisturbed run, token for token.
  b = Engine(CFG, params, ENGINE, moe_state=state)
  b.submit([request_from_json(request_to_json(r)) for r in partial.values()])  # via the wire
  b.step()
  for rid, r in partial.items():
    n = r.num_routed
    got = np.asarray(b.cache.k[:, _slot_of(b, rid), :n])
    want = prefix[rid][:, :n]
    # Rows decoded one token at a time, now prefilled as a block: float32 rounding only.
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max(), np.abs(got - want).max()
  done = {c.request_id: c.request for c in b.run()}
  for rid, r in ref.items():
    np.testing.assert_array_equal(done[rid].tokens, r.tokens)
    np.testing.assert_array_equal(done[rid].routes, r.routes)
    np.testing.assert_allclose(done[rid].logprobs, r.logprobs, atol=1e-6)
  # On an engine whose balancing state moved on, the recorded routes rebuild the same KV, where
  # routing the prefix live would not.
  moved = state._replace(q=state.q[:, ::-1] * 4.0)
  for forced in (True, False):
    c = Engine(CFG, params, ENGINE, moe_state=moved)
    c.submit([dataclasses.replace(r, routes=r.routes if forced else None)
              for r in partial.values()])
    c.step()
    err = max(float(np.abs(np.asarray(c.cache.k[:, _slot_of(c, rid), :r.num_routed])
                           - prefix[rid][:, :r.num_routed]).max())
              for rid, r in partial.items())
    assert (err < 1e-5) if forced else (err > 1e-3), (forced, err)


def test_route_records_stay_contiguous():
  r = Request(0, [1, 2, 3], 6, request_key(0, 0))
  first = TokenChunk(0, 0, np.array([5, 6]), np.array([-1.0, -2.0]), 0,
                     routes=np.arange(16, dtype=np.uint8).reshape(4, 2, 2))  # prefix (2) + 2
  for piece in first.split():                  # a worker releasing one token at a time
    r.extend(piece.tokens, piece.logprobs, piece.version, piece.routes)
  np.testing.assert_array_equal(r.routes, first.routes)
  r.extend([7], [-1.0], 1, np.ones((1, 2, 2), np.uint8))
  assert r.num_routed == 5
  with pytest.raises(ValueError, match="without routes extend a request that records routes"):
    r.extend([8], [-1.0], 1)
  with pytest.raises(ValueError, match=r"routes of 7 positions .* \(prompt \+ tokens - 1 = 6\)"):
    r.extend([8], [-1.0], 1, np.ones((2, 2, 2), np.uint8))   # a duplicated route
  assert r.num_generated == 3 and r.num_routed == 5           # left as it was
  back = request_from_json(request_to_json(r))
  np.testing.assert_array_equal(back.routes, r.routes)
  assert back.routes.dtype == np.uint8
  r.truncate(1)
  assert r.num_routed == 3

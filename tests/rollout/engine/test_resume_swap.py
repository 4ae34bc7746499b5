"""Interrupt-and-resume, weight swap and steady-state compilation of the engine."""
import dataclasses

import numpy as np

import jax

from jaxrl_sys.rollout import Engine
from jaxrl_sys.rollout.engine import slots
from tests.rollout.common import (CFG, SAMPLED, assert_matches, engine_config, make_requests,
                                  params, reference)


def _uninterrupted(reqs):
  eng = Engine(CFG, params(), engine_config())
  eng.submit(reqs)
  return {c.request_id: c for c in eng.run()}


def test_interrupt_and_resume_elsewhere_is_identical():
  reqs = make_requests(12, seed=7, group=3)
  ref = _uninterrupted(reqs)
  rng = np.random.default_rng(0)
  cut_points = []
  for _ in range(3):
    engines = [Engine(CFG, params(), engine_config())]
    engines[0].submit(reqs)
    done = []
    for hop in range(3):  # interrupt twice, each time moving a random subset to a fresh engine
      eng = engines[-1]
      for _ in range(int(rng.integers(1, 4))):
        eng.step()
      running = [r.request_id for r in eng.running_requests()]
      moved = eng.abort(rng.choice(running, size=max(1, len(running) // 2), replace=False)
                        if hop < 2 and running else [])
      cut_points += [r.num_generated for r in moved]
      for r in moved:
        assert r.remaining == r.max_new_tokens - r.num_generated
        assert (r.versions == 0).all() and len(r.logprobs) == r.num_generated
      nxt = Engine(CFG, params(), engine_config())
      nxt.submit(moved)
      engines.append(nxt)
    for eng in engines:
      done += eng.run()
    assert sorted(c.request_id for c in done) == sorted(ref)
    for c in done:
      want = ref[c.request_id]
      np.testing.assert_array_equal(c.request.tokens, want.request.tokens)
      np.testing.assert_allclose(c.request.logprobs, want.request.logprobs, atol=1e-5)
      np.testing.assert_array_equal(c.request.prompt, want.request.prompt)
      assert c.finish == want.finish
  assert any(0 < n for n in cut_points) and len(set(cut_points)) >= 2


def test_resume_at_any_token_position_matches():
  # a request handed over with tokens generated elsewhere (cut anywhere, not only at chunk
  # boundaries) continues exactly as the uninterrupted run
  reqs = make_requests(8, seed=8, group=2)
  ref = _uninterrupted(reqs)
  rng = np.random.default_rng(1)
  for _ in range(3):
    partial = []
    for r in reqs:
      full = ref[r.request_id].request
      n = int(rng.integers(0, full.num_generated))  # the last token stays to be generated
      partial.append(dataclasses.replace(r, tokens=full.tokens[:n], logprobs=full.logprobs[:n],
                                         versions=full.versions[:n]))
    eng = Engine(CFG, params(), engine_config())
    eng.submit(partial)
    assert_matches(eng.run(), {k: (v.request.tokens, v.request.logprobs) for k, v in ref.items()})


def _swap_run(reqs, cfg, steps_before):
  eng = Engine(CFG, params(0), cfg, version=0)
  eng.submit(reqs)
  for _ in range(steps_before):
    eng.step()
  at_swap = {r.request_id: r.num_generated for r in eng.running_requests()}
  early = {c.request_id: c for c in eng.take_completions()}
  eng.load(params(1), 1)
  return eng, at_swap, early, {c.request_id: c for c in eng.run()}


def test_weight_swap_versions_per_token():
  reqs = make_requests(9, seed=9)
  ref = _uninterrupted(reqs)
  eng, at_swap, early, late = _swap_run(reqs, engine_config(), 2)
  assert at_swap and early.keys() | late.keys() == {r.request_id for r in reqs}
  for rid, c in {**early, **late}.items():
    r = c.request
    n0 = r.num_generated if rid in early else at_swap.get(rid, 0)
    assert (r.versions[:n0] == 0).all() and (r.versions[n0:] == 1).all()
    # tokens before the swap are the old weights' tokens
    np.testing.assert_array_equal(r.tokens[:n0], ref[rid].request.tokens[:n0])
  assert eng.version == 1 and any(0 < n < len(late[i].request.tokens) for i, n in at_swap.items())


def test_weight_swap_with_kv_recompute_equals_resume_under_new_weights():
  reqs = make_requests(6, seed=10)
  _, at_swap, early, late = _swap_run(reqs, engine_config(recompute_kv_on_swap=True), 2)
  # the same partial requests, resumed on a fresh engine that has the new weights
  eng = Engine(CFG, params(0), engine_config())
  eng.submit(reqs)
  eng.step()
  eng.step()
  eng.take_completions()
  moved = eng.abort()
  fresh = Engine(CFG, params(1), engine_config(), version=1)
  fresh.submit(moved)
  want = {c.request_id: c.request for c in fresh.run()}
  assert set(want) == set(late)
  for rid, c in late.items():
    np.testing.assert_array_equal(c.request.tokens, want[rid].tokens)
    np.testing.assert_allclose(c.request.logprobs, want[rid].logprobs, atol=1e-5)
    np.testing.assert_array_equal(c.request.versions, want[rid].versions)


def test_no_recompilation_after_warmup_over_200_requests():
  rng = np.random.default_rng(11)
  reqs = make_requests(200, seed=11, group=4)  # (request keys are computed with jax here)
  fresh = [r for i, r in enumerate(reqs) if i % 7]
  for r in reqs[::7]:  # some arrive as partial responses (longer prefills, other buckets)
    n = int(rng.integers(0, r.max_new_tokens))
    r.tokens, r.logprobs = rng.integers(1, CFG.vocab_size, n), np.zeros(n, np.float32)
    r.versions = np.zeros(n, np.int32)
  eng = Engine(CFG, params(), engine_config())
  eng.warmup()
  lowered = []
  event = "/jax/core/compile/jaxpr_to_mlir_module_duration"

  def listener(name, *args, **kwargs):
    if name == event:
      lowered.append(kwargs.get("fun_name", "?"))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    before, before_total = eng.stats.compilations, slots.num_compilations()
    done = []
    for i in range(0, 200, 25):  # arrivals in waves while the engine runs
      eng.submit(reqs[i:i + 25])
      for _ in range(int(rng.integers(1, 6))):
        eng.step()
      done += eng.take_completions()
    done += eng.run()
  finally:
    unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
    if unregister is not None:
      unregister(listener)
  assert len(done) == 200
  assert eng.stats.compilations == before and slots.num_compilations() == before_total
  assert not lowered, lowered
  st = eng.stats
  assert st.prefill_rows < 200 and st.prefix_hits > 50 and st.decode_calls > 50
  ref = reference(fresh, SAMPLED)
  assert_matches([c for c in done if c.request_id in ref], ref)

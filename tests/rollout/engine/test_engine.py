"""Engine outputs equal the plain sampler whatever the slots, arrival order and sharing."""
import dataclasses

import numpy as np
import pytest

from jaxrl_sys.rollout import Engine, FinishReason, Request, request_key
from tests.rollout.common import (CFG, GREEDY, SAMPLED, assert_matches, engine_config,
                                  make_requests, params, reference)


def _run_shuffled(reqs, cfg, seed):
  """Submits `reqs` in a shuffled order, a few at a time between steps."""
  rng = np.random.default_rng(seed)
  order = [reqs[i] for i in rng.permutation(len(reqs))]
  eng = Engine(CFG, params(), cfg)
  done = []
  while order or eng.has_work():
    for _ in range(int(rng.integers(0, 4))):
      if order:
        eng.submit([order.pop()])
    eng.step()
    done += eng.take_completions()
  return eng, done


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "top_p"])
def test_matches_plain_sampler_any_slot_and_arrival_order(sampling):
  reqs = make_requests(10, seed=1)
  ref = reference(reqs, sampling)
  for seed in (0, 1):
    eng, done = _run_shuffled(reqs, engine_config(sampling), seed)
    assert_matches(done, ref)
    assert eng.stats.completed == 10 and eng.num_running == eng.num_waiting == 0


def test_stop_tokens_finish_requests():
  reqs = make_requests(10, seed=2)
  base = reference(reqs, SAMPLED)
  stop = int(base[0][0][2])  # the third token of request 0 becomes a stop token
  s = dataclasses.replace(SAMPLED, stop_tokens=(stop,))
  ref = reference(reqs, s)
  eng, done = _run_shuffled(reqs, engine_config(s), 3)
  assert_matches(done, ref)
  for c in done:
    toks = c.request.tokens
    if stop in toks:
      assert c.finish == FinishReason.STOP and toks[-1] == stop and list(toks).count(stop) == 1
    else:
      assert c.finish == FinishReason.LENGTH and len(toks) == c.request.max_new_tokens


def test_shared_prompt_prefilled_once_per_group():
  reqs = make_requests(12, seed=4, group=4)  # 3 prompts x G=4
  ref = reference(reqs, SAMPLED)
  eng = Engine(CFG, params(), engine_config())  # groups straddle admission rounds
  eng.submit(reqs)
  done = eng.run()
  assert_matches(done, ref)
  total_prompt = sum(len(r.prompt) - 1 for r in reqs[::4])
  assert eng.stats.prefill_rows == 3 and eng.stats.prefill_tokens == total_prompt
  assert eng.stats.prefix_hits == 9
  sep = Engine(CFG, params(), engine_config(share_prefixes=False))
  sep.submit(reqs)
  assert_matches(sep.run(), ref)
  assert sep.stats.prefill_rows == 12 and sep.stats.prefix_hits == 0


def test_streamed_chunks_rebuild_completions():
  reqs = make_requests(8, seed=5)
  got = {}
  eng = Engine(CFG, params(), engine_config(),
               on_chunk=lambda chunks: [got.setdefault(c.request_id, []).append(c) for c in chunks])
  eng.submit(reqs)
  done = {c.request_id: c for c in eng.run()}
  for rid, chunks in got.items():
    assert [c.start for c in chunks] == list(np.cumsum([0] + [len(c.tokens) for c in chunks])[:-1])
    assert all(1 <= len(c.tokens) <= 3 for c in chunks)
    assert all(c.finish is None for c in chunks[:-1]) and chunks[-1].finish == done[rid].finish
    np.testing.assert_array_equal(np.concatenate([c.tokens for c in chunks]),
                                  done[rid].request.tokens)
    np.testing.assert_array_equal(np.concatenate([c.logprobs for c in chunks]),
                                  done[rid].request.logprobs)
  assert set(got) == set(done)


def test_errors_are_clear():
  eng = Engine(CFG, params(), engine_config(max_len=16, prefill_buckets=(8, 16),
                                            decode_len_buckets=(16,)))
  with pytest.raises(ValueError, match="prompt longer than the context"):
    eng.submit([Request(0, np.arange(1, 10), 8, request_key(0, 0))])
  with pytest.raises(ValueError, match="vocab_size"):
    eng.submit([Request(0, [1, 99], 4, request_key(0, 0))])
  eng.submit([Request(1, [1, 2], 4, request_key(0, 1))])
  with pytest.raises(ValueError, match="already in this engine"):
    eng.submit([Request(1, [1, 2], 4, request_key(0, 1))])
  with pytest.raises(ValueError, match="version"):
    eng.submit([Request(2, [1, 2], 4, request_key(0, 2), min_version=3)])
  bad = dict(params(), embed=params()["embed"][:10])  # noqa: E501
  with pytest.raises(ValueError, match="shape"):
    eng.load(bad, 1)
  with pytest.raises(ValueError, match="max_seq_len"):
    Engine(CFG, params(), engine_config(max_len=128))


def test_abort_returns_running_and_waiting_and_finished_partials_complete():
  reqs = make_requests(6, seed=6)
  eng = Engine(CFG, params(), engine_config())
  eng.submit(reqs)
  eng.step()
  assert eng.num_running + eng.num_waiting + eng.num_unread_completions == 6
  out = eng.abort()
  assert sorted(r.request_id for r in out) == sorted(
      r.request_id for r in reqs if r.request_id not in {c.request_id for c in
                                                          eng.take_completions()})
  assert not eng.has_work() and eng.abort([0, 1]) == []
  # a partial with no budget left completes at once
  r = dataclasses.replace(reqs[0], tokens=[3, 4], logprobs=[-1.0, -1.0], versions=[0, 0],
                          max_new_tokens=2)
  eng.submit([r])
  (c,) = eng.take_completions()
  assert c.finish == FinishReason.LENGTH and c.request.num_generated == 2


def test_single_token_prompts_and_budget_one():
  reqs = [Request(i, [5 + i], 1 + (i % 3) * 5, request_key(9, i)) for i in range(5)]
  ref = reference(reqs, SAMPLED)
  eng = Engine(CFG, params(), engine_config())
  eng.submit(reqs)
  assert_matches(eng.run(), ref)


def test_prompt_plus_budget_filling_the_context():
  r = Request(0, np.arange(1, 21) % 60 + 1, 12, request_key(0, 0))  # 20 + 12 = max_len
  ref = reference([r], GREEDY)
  eng = Engine(CFG, params(), engine_config(GREEDY))
  eng.submit([r])
  assert_matches(eng.run(), ref)


def test_tail_runs_on_a_smaller_packed_decode_batch():
  # the long request lands in the last slot; once the short ones finish it is moved to slot 0
  # and decoded with 2 rows (row buckets (2, 3)) and a 16-slot window, with the same output
  reqs = make_requests(3, seed=14)
  reqs = [dataclasses.replace(r, max_new_tokens=n) for r, n in zip(reqs, (2, 3, 12))]
  eng = Engine(CFG, params(), engine_config())
  eng.submit(reqs)
  done = eng.run()
  assert_matches(done, reference(reqs, SAMPLED))
  st = eng.stats
  assert st.moved_rows == 1 and st.decode_row_steps < 3 * st.decode_steps


def test_packing_keeps_the_held_prefixes_of_next_turns():
  """`extend_prefixes`: two short first turns finish and their slots (0, 1) hold their
  sequences; packing the long one down to the 2-row bucket swaps it with a held slot instead of
  overwriting it, so both next turns extend their kept rows (no prefill) and every output
  equals the plain sampler on the whole sequence."""
  reqs = make_requests(3, seed=14)
  reqs = [dataclasses.replace(r, max_new_tokens=n) for r, n in zip(reqs, (2, 2, 12))]
  eng = Engine(CFG, params(), engine_config(extend_prefixes=True))
  eng.submit(reqs)
  done = []
  while len(done) < 2:
    eng.step()
    done += eng.take_completions()
  eng.step()  # the long request is packed down into a held slot
  assert eng.stats.moved_rows == 1
  prefills = eng.stats.prefill_calls
  nxt = [Request(10 + c.request_id, np.concatenate([c.request.prompt, c.request.tokens, [5, 6]]),
                 4, request_key(3, 10 + c.request_id)) for c in done]
  eng.submit(nxt)
  done += eng.run()
  assert eng.stats.prefill_calls == prefills and eng.stats.extend_calls > 0
  assert eng.stats.reused_tokens == sum(len(r.prompt) - 3 for r in nxt)
  assert_matches(done, reference(reqs + nxt, SAMPLED))

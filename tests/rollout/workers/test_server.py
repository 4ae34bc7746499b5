"""`WorkerServer` with a token delay: a step's tokens are released one decode position at a
time (each after its share of the delay), identical to the undelayed step's tokens."""
import numpy as np

from jaxrl_sys.rollout import WorkerServer
from tests.rollout import common


def _run(delay):
  server = WorkerServer("w", common.CFG, common.engine_config(common.GREEDY), token_delay=delay)
  server.loaded(0, common.params(), None, 0.0)
  releases = []  # tokens buffered at each on_progress call
  server.on_progress = lambda: releases.append(sum(len(c.tokens) for c in server._chunks))  # pylint: disable=protected-access
  server.submit(common.make_requests(3, seed=5))
  tokens = server.step()
  return server.report(), tokens, releases


def test_delayed_tokens_stream_per_position_and_equal_the_undelayed_step():
  plain, n_plain, none = _run(0.0)
  slow, n_slow, releases = _run(0.002)
  assert n_plain == n_slow > 0 and none == []
  by_request = lambda rep: {  # noqa: E731
      rid: (np.concatenate([c.tokens for c in rep.chunks if c.request_id == rid]),
            np.concatenate([c.logprobs for c in rep.chunks if c.request_id == rid]),
            [c.finish for c in rep.chunks if c.request_id == rid][-1])
      for rid in {c.request_id for c in rep.chunks}}
  want, got = by_request(plain), by_request(slow)
  assert want.keys() == got.keys()
  for rid, (toks, lps, finish) in want.items():
    np.testing.assert_array_equal(got[rid][0], toks)
    np.testing.assert_array_equal(got[rid][1], lps)
    assert got[rid][2] == finish
  # one release per decode position, each adding the tokens of the requests still producing
  longest = max(len(t) for t, _, _ in want.values())
  per_position = [sum(len(t) > j for t, _, _ in want.values()) for j in range(longest)]
  assert np.diff([0] + releases).tolist() == per_position
  # chunks are contiguous one-token pieces; only a request's last one carries its finish
  for rid in want:
    mine = [c for c in slow.chunks if c.request_id == rid]
    assert [c.start for c in mine] == list(range(mine[0].start, mine[0].start + len(mine)))
    assert all(c.finish is None for c in mine[:-1])


def test_idle_warmup_serves_at_once_and_compiles_the_rest_while_idle():
  server = WorkerServer("w", common.CFG, common.engine_config(common.GREEDY), warmup="idle")
  server.loaded(0, common.params(), None, 0.0)
  assert server.version == 0 and server.engine._warmed == 0  # ready before any compile  # pylint: disable=protected-access
  server.submit(common.make_requests(2, seed=3))
  assert not server.warm_when_idle()  # work first: no warm-up while requests wait
  while server.has_work():
    server.step()
  c = common.engine_config(common.GREEDY)
  variants = (len(c.prefill_buckets) * len(c.prefill_batch_buckets) + len(c.copy_buckets)
              + len(c.decode_row_buckets) * len(c.decode_len_buckets))
  steps = 0
  while server.warm_when_idle():
    steps += 1
  assert steps == variants and not server.warm_when_idle()
  before = server.engine.stats.compilations
  server.submit(common.make_requests(3, seed=4, first_id=10))
  while server.has_work():
    server.step()
  assert server.engine.stats.compilations == before  # every shape was compiled while idle

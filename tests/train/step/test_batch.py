"""Host-side packing, request keys and the rollout buffer's serialisation."""
import json

import numpy as np
import pytest

from jaxrl_sys.rollout.types import Completion, FinishReason, Request, request_key
from jaxrl_sys.train.step.batch import (Sample, micro_batches, pack, row_granule, row_length, split,
                                        stack)
from jaxrl_sys.train.loop.buffer import RolloutBuffer
from jaxrl_sys.train.loop.groups import request_keys


def test_pack_aligns_targets_and_response_masks():
  s = Sample(prompt=np.array([1, 7, 8]), tokens=np.array([4, 5, 2]),
             logprobs=np.array([-0.1, -0.2, -0.3], np.float32), versions=np.array([3, 3, 4]),
             advantage=0.5, weight=1.0)
  pivot = Sample(np.array([1, 9]), np.array([6]), np.array([-1.0], np.float32), np.array([3]),
                 advantage=0.0, weight=0.0)
  b = pack([s, pivot], rows=3, seq_len=8, pad_id=0)
  np.testing.assert_array_equal(b.tokens[0], [1, 7, 8, 4, 5, 2, 0, 0])
  np.testing.assert_array_equal(b.targets[0], [7, 8, 4, 5, 2, 0, 0, 0])
  # the response token j is predicted at position len(prompt) - 1 + j
  np.testing.assert_array_equal(b.loss_mask[0], [0, 0, 1, 1, 1, 0, 0, 0])
  np.testing.assert_allclose(b.behav_logprobs[0, 2:5], [-0.1, -0.2, -0.3])
  np.testing.assert_array_equal(b.versions[0], [-1, -1, 3, 3, 4, -1, -1, -1])
  np.testing.assert_array_equal(b.attention_mask[0], [1] * 6 + [0, 0])
  assert b.loss_mask[1].sum() == 0 and b.versions[1, 1] == 3   # excluded pivot
  assert b.loss_mask[2].sum() == 0 and b.attention_mask[2, 0] == 1  # padding row
  assert b.advantages.tolist() == [0.5, 0.0, 0.0]
  assert stack([b, b]).tokens.shape == (2, 3, 8)
  assert split(pack([s] * 4, 4, 8), 2).tokens.shape == (2, 2, 8)
  with pytest.raises(ValueError, match="exceeds seq_len"):
    pack([s], rows=1, seq_len=4)
  # The last response token is only a target: 5 input positions hold the 3 + 3 tokens.
  tight = pack([s], rows=1, seq_len=5)
  np.testing.assert_array_equal(tight.tokens[0], b.tokens[0, :5])
  for name in ("targets", "loss_mask", "behav_logprobs", "versions", "attention_mask"):
    np.testing.assert_array_equal(getattr(tight, name)[0], getattr(b, name)[0, :5], name)



def test_pack_moves_routes_with_their_tokens_and_leaves_the_rest_live():
  """Routes of position i (the experts that fed token i) land at row position i; the last
  response token (never fed), padding, padding rows and samples without routes route live."""
  rng = np.random.default_rng(0)
  s = Sample(np.array([1, 7, 8]), np.array([4, 5, 2]), np.zeros(3, np.float32), np.zeros(3),
             advantage=1.0, routes=rng.integers(0, 8, (5, 2, 2)).astype(np.uint8))
  bare = Sample(np.array([1, 9]), np.array([6]), np.zeros(1, np.float32), np.zeros(1), 0.0)
  b = pack([s, bare], rows=3, seq_len=8, route_shape=(2, 2, np.uint8))
  assert b.routes.shape == (3, 8, 2, 2) and b.routes.dtype == np.uint8
  np.testing.assert_array_equal(b.routes[0, :5], s.routes)
  np.testing.assert_array_equal(b.route_mask, [[1] * 5 + [0] * 3, [0] * 8, [0] * 8])
  assert not b.routes[1:].any() and stack([b, b]).routes.shape == (2, 3, 8, 2, 2)
  assert pack([s], rows=1, seq_len=8).routes is None          # no replay: no routes
  with pytest.raises(ValueError, match=r"expected \[prompt \+ response - 1 = 5, 2, 2\]"):
    pack([Sample(s.prompt, s.tokens, s.logprobs, s.versions, 1.0, routes=s.routes[:4])], 1, 8,
         route_shape=(2, 2, np.uint8))

def test_request_keys_match_request_key():
  ids = [0, 1, 5, 77, 123456]
  for seed in (0, 9):
    np.testing.assert_array_equal(request_keys(seed, ids),
                                  np.stack([request_key(seed, i) for i in ids]))


def test_buffer_json_is_exact_and_plain():
  buf = RolloutBuffer(samples_per_group=2)
  buf.add_group(3, version=2)
  lp = np.array([-0.123456789, -1e-30], np.float32)
  done = Request(6, [1, 4], 5, request_key(0, 6), group_id=3, tokens=[7, 2], logprobs=lp,
                 versions=[1, 2], min_version=1, meta={"group": 3, "sample": 0})
  buf.record([Completion(done, FinishReason.STOP)])
  buf.partials.append(Request(7, [1, 4], 5, request_key(0, 7), group_id=3, tokens=[9],
                              logprobs=[-2.5], versions=[2]))
  text = json.dumps(buf.to_json())          # plain JSON, no pickles
  back = RolloutBuffer.from_json(json.loads(text))
  got = back.groups[3].done[0]
  assert got.finish == FinishReason.STOP and got.request.min_version == 1
  np.testing.assert_array_equal(got.request.logprobs, lp)   # bit-exact floats
  np.testing.assert_array_equal(got.request.key, done.key)
  assert back.partials[0].tokens.tolist() == [9] and not back.groups[3].complete
  assert back.to_json() == buf.to_json()


@pytest.mark.parametrize("max_groups,min_groups", [(16, 1), (8, 2), (12, 1), (4, 4)])
def test_micro_batches_cover_the_groups_with_little_padding(max_groups, min_groups):
  shapes = set()
  for n in range(0, 40):
    mbs = micro_batches(n, max_groups, min_groups)
    assert sum(g for g, _ in mbs) == n
    for g, padded in mbs:
      shapes.add(padded)
      assert 1 <= g <= padded <= max_groups
      assert padded == max_groups or (padded & (padded - 1) == 0 and padded >= min_groups)
      # padding only up to a quarter of the micro-batch, or where min_groups forces it
      assert 4 * (padded - g) <= padded or padded == min(max(min_groups, 1), max_groups) or (
          g < min_groups)
  assert len(shapes) <= max_groups.bit_length() + 1          # few compiled shapes
  assert micro_batches(8, 16) == [(8, 8)]                     # the 8-group step: no padding
  assert micro_batches(5, 16) == [(4, 4), (1, 1)]


def test_pack_with_a_window_scores_only_the_response_positions():
  s = Sample(prompt=np.array([1, 7, 8]), tokens=np.array([4, 5, 2]),
             logprobs=np.array([-0.1, -0.2, -0.3], np.float32), versions=np.array([3, 3, 4]),
             advantage=0.5, weight=1.0)
  short = Sample(np.array([1, 9, 9, 9]), np.array([6]), np.array([-1.0], np.float32),
                 np.array([3]), advantage=1.0, weight=1.0)
  full = pack([s, short], rows=3, seq_len=8)
  b = pack([s, short], rows=3, seq_len=8, window=4)
  assert b.score_start.tolist() == [2, 3, 0] and full.score_start.tolist() == [0, 0, 0]
  assert b.targets.shape == b.loss_mask.shape == b.versions.shape == (3, 4)
  for r in range(2):   # entry j of the window is position score_start + j of the full layout
    cols = b.score_start[r] + np.arange(4)
    for name in ("targets", "loss_mask", "behav_logprobs", "versions"):
      np.testing.assert_array_equal(getattr(b, name)[r], getattr(full, name)[r, cols], name)
  np.testing.assert_array_equal(b.loss_mask[0], [1, 1, 1, 0])
  np.testing.assert_array_equal(b.tokens, full.tokens)
  with pytest.raises(ValueError, match="scoring window of 2"):
    pack([s], rows=1, seq_len=8, window=2)           # the response is longer than the window
  with pytest.raises(ValueError, match="end by seq_len"):
    pack([short], rows=1, seq_len=6, window=4)       # 3 + 4 > 6


def test_row_length_covers_the_rows_in_few_lengths():
  assert [row_granule(p) for p in (1, 5, 6, 8, 9, 16, 512)] == [1, 2, 2, 2, 4, 4, 128]

  def sample(lp, lr):
    return Sample(np.ones(lp, np.int32), np.ones(lr, np.int32), np.zeros(lr, np.float32),
                  np.zeros(lr, np.int32), advantage=0.0)

  # The window must end by T: prompts of 6 and a 32-token window need 37 -> 38 of 40.
  assert row_length([sample(6, 3), sample(4, 32)], 40, 2, window=32) == 38
  assert row_length([sample(8, 32)], 40, 2, window=32) == 40
  assert row_length([sample(3, 2), sample(2, 5)], 40, 4) == 8          # no window: lp + lr
  rng = np.random.default_rng(0)
  lengths = set()
  for _ in range(300):   # any prompts up to the bucket of 16 and responses up to W = 24
    batch = [sample(int(rng.integers(1, 17)), int(rng.integers(1, 25)))
             for _ in range(int(rng.integers(1, 5)))]
    t = row_length(batch, 40, row_granule(16), window=24)
    lengths.add(t)
    packed = pack(batch, len(batch), t, window=24)     # every sample fits its row length
    assert packed.tokens.shape[1] == t and t % 4 == 0
  assert len(lengths) <= 5, lengths

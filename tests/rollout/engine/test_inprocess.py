"""InProcessRollout implements the RolloutClient contract over one engine."""
import inspect

from jaxrl_sys.rollout import FinishReason, InProcessRollout, RolloutClient
from tests.rollout.common import CFG, engine_config, make_requests, params, reference, SAMPLED


def test_client_surface_matches_protocol():
  for name in ("submit", "poll", "abort", "publish", "num_pending"):
    want = inspect.signature(getattr(RolloutClient, name))
    got = inspect.signature(getattr(InProcessRollout, name))
    assert list(got.parameters) == list(want.parameters), name


def test_poll_drives_generation_until_min_count():
  reqs = make_requests(8, seed=12, group=2)
  ref = reference(reqs, SAMPLED)
  client = InProcessRollout.create(CFG, params(), engine_config(), version=3)
  client.submit(reqs)
  assert client.num_pending() == 8
  assert client.poll(timeout=0) == []  # timeout 0: nothing generated yet, nothing returned
  first = client.poll(min_count=3)
  assert len(first) >= 3 and client.num_pending() == 8 - len(first)
  rest = []
  while client.num_pending():
    rest += client.poll()
  got = {c.request_id: c for c in first + rest}
  assert len(got) == 8 and client.poll() == []
  for rid, c in got.items():
    assert list(c.request.tokens) == list(ref[rid][0]) and (c.request.versions == 3).all()
    assert c.finish == FinishReason.LENGTH


def test_abort_and_publish_weights():
  reqs = make_requests(6, seed=13)
  client = InProcessRollout.create(CFG, params(), engine_config())
  client.submit(reqs)
  client.engine.step()
  aborted = client.abort([reqs[0].request_id, reqs[5].request_id])
  assert {r.request_id for r in aborted} <= {reqs[0].request_id, reqs[5].request_id}
  client.publish(params(1), 1)
  client.submit(aborted)  # resumed, now under version 1
  done = []
  while client.num_pending():
    done += client.poll()
  assert len(done) == 6 and client.stats.completed == 6 and client.stats.aborted == len(aborted)
  moved = {r.request_id for r in aborted}
  assert moved and all(c.request.versions[-1] == 1 for c in done if c.request_id in moved)

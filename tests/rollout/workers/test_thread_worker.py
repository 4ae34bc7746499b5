"""`ThreadWorker`: in-process engines on threads of their own under the rollout manager.

References: `models.generate` with the requests' keys (`common.reference`) for the tokens and
log-probs; a second, identical run for reproducibility.
"""
import numpy as np
import pytest

from jaxrl_sys.rollout import ManagerConfig, RolloutManager, ThreadWorker
from tests.rollout import common


def _manager(version=1):
  ws = [ThreadWorker(f"t{i}", common.CFG, common.engine_config()) for i in range(2)]
  m = RolloutManager(ws, config=ManagerConfig(theta=1, plateau_batch=3))
  m.publish(common.params(), version)
  return m, ws


def _drain(m):
  out = []
  while m.num_pending():
    out += m.poll(min_count=1, timeout=60.0)
  return out


def test_two_thread_workers_match_the_reference_and_repeat_exactly():
  reqs = common.make_requests(12, seed=41, group=2)
  ref = common.reference(reqs, common.SAMPLED)
  runs = []
  for _ in range(2):
    m, _ = _manager()
    m.submit(common.make_requests(12, seed=41, group=2))   # fresh requests: submit fills them
    out = _drain(m)
    common.assert_matches(out, ref)
    assert {m.fleet.provenance(c.request_id)[0][0] for c in out} == {"t0", "t1"}  # both generated
    runs.append(({c.request_id: c.request.logprobs for c in out},
                 {c.request_id: m.fleet.provenance(c.request_id) for c in out}))
    m.close()
  (lp_a, prov_a), (lp_b, prov_b) = runs
  assert prov_a == prov_b                      # the same dispatch and moves, token for token
  for rid, lp in lp_a.items():
    np.testing.assert_array_equal(lp_b[rid], lp, err_msg=f"request {rid}")


def test_a_killed_thread_worker_hands_over_every_token():
  reqs = common.make_requests(10, seed=42, group=2)
  ref = common.reference(reqs, common.SAMPLED)
  m, ws = _manager()
  m.submit(reqs)
  done = m.poll(min_count=1, timeout=60.0)
  ws[0].kill()
  out = done + _drain(m)
  common.assert_matches(out, ref)
  assert m.fleet.stats.lost == 1 and m.fleet.stats.migrated >= 1
  m.close()


def test_an_error_in_a_worker_thread_is_raised_by_poll():
  # (Weights that do not fit the model no longer reach the engine: a failed pull, see
  # manager/test_deadlines.py.) An engine step that raises in the worker's thread:
  m, ws = _manager()
  m.submit(common.make_requests(2, seed=43))
  _drain(m)                                    # the engines exist now

  def broken():
    raise ValueError("engine step failed in its thread")

  for w in ws:
    w.server.engine.step = broken
  m.submit(common.make_requests(2, seed=44, first_id=100))
  with pytest.raises(ValueError, match="engine step failed in its thread"):
    _drain(m)
  m.close()

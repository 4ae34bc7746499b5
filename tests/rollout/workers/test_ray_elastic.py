"""Elastic rollout on real Ray processes: a SIGKILLed worker's responses migrate token by token,
and a worker joining mid-step pulls the current weights and takes work in the same step.

The reference is `models.generate` with the requests' keys (`common.reference`): the responses
must equal an undisturbed run's, token for token.
"""
import os
import signal
import time


from jaxrl_sys.rollout import ManagerConfig, RolloutManager
from tests.conftest import RAY_COMPILE_CACHE
from tests.rollout import common



def _worker(name, delay=0.01):
  from jaxrl_sys.rollout.workers.ray import RayWorker  # pylint: disable=import-outside-toplevel
  return RayWorker(name, common.CFG, common.engine_config(), compile_cache=RAY_COMPILE_CACHE,
                   token_delay=delay)


def _manager(workers):
  from jaxrl_sys.rollout.weights.ray import RayWeightStore  # pylint: disable=import-outside-toplevel
  m = RolloutManager(workers, store=RayWeightStore(),
                     config=ManagerConfig(theta=1, heartbeat_timeout=20.0, balance=False))
  m.publish(common.params(), 1)
  return m


def _check(out, reqs):
  ids = [c.request_id for c in out]
  assert sorted(ids) == sorted(r.request_id for r in reqs), "a request was lost or duplicated"
  common.assert_matches(out, common.reference(reqs, common.SAMPLED))


def test_sigkill_mid_generation_keeps_every_token(ray_session):  # pylint: disable=unused-argument
  workers = [_worker(f"k{i}") for i in range(3)]
  m = _manager(workers)
  reqs = common.make_requests(12, seed=41, group=2)
  for r in reqs:
    r.max_new_tokens = 12
  m.submit(reqs)
  out, victim, held = [], workers[0], None
  deadline = time.monotonic() + 240
  while m.num_pending() and time.monotonic() < deadline:
    out += m.poll(min_count=1, timeout=0.2)
    ws = m.fleet.get(victim.worker_id)
    tokens = {r.request_id: r.num_generated for r in m.snapshot()}
    if held is None and ws is not None and any(tokens.get(r, 0) for r in ws.assigned):
      held = {r: tokens[r] for r in ws.assigned}
      os.kill(victim.pid(), signal.SIGKILL)  # its pid, from the actor: a real preemption
  assert held is not None, "the victim never held a partly generated request"
  _check(out, reqs)
  assert [e[2] for e in m.fleet.events if e[1] == "lost"] == [victim.worker_id]
  kept = 0
  for rid, n in held.items():
    prov = m.fleet.provenance(rid)
    if n:  # generated before the kill: kept, and the next worker continued from there
      assert prov[0][0] == victim.worker_id and prov[0][2] >= n, prov
      kept += prov[0][2]
      assert all(p[0] != victim.worker_id for p in prov[1:]) and prov[1][1] == prov[0][2]
  assert m.fleet.stats.tokens_kept == kept > 0
  # The survivors produced exactly the tokens the victim had not: nothing regenerated.
  survivors = sum(w.stats()["generated_tokens"] for w in workers[1:])
  assert survivors == sum(len(c.request.tokens) for c in out) - kept
  m.close()


def test_worker_joining_mid_step_pulls_current_weights_and_takes_work(ray_session):  # pylint: disable=unused-argument
  m = _manager([_worker("j0", delay=0.05)])  # ~5 s of generation: the step outlasts a join
  m.publish(common.params(), 2)  # the current version is 2 when the step starts
  reqs = common.make_requests(9, seed=42, group=3)
  for r in reqs:
    r.max_new_tokens, r.min_version = 12, 2
  m.submit(reqs)
  out = m.poll(timeout=0.3)  # the step is under way on j0 (3 slots, Θ=1: 5 requests wait)
  joiner = _worker("j1")
  m.add_worker(joiner)
  while m.num_pending():
    out += m.poll(min_count=1, timeout=60.0)
  _check(out, reqs)
  ready = [e for e in m.fleet.events if e[1] == "ready" and e[2] == "j1"]
  assert ready and ready[0][3] == "2"
  assert any(seg[0] == "j1" for c in out for seg in m.fleet.provenance(c.request_id))
  for c in out:
    assert (c.request.versions == 2).all()
  m.close()

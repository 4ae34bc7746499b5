"""The `RolloutClient` contract, one suite run against four backends of the rollout manager:
in-process engine workers (in `receive()`, or on threads of their own), Ray actor workers (real
processes) and scripted fake workers (latency, out-of-order completions, one death).

References are independent of the manager: `models.generate` with the requests' keys for the
engine-backed workers (`common.reference`), `fake_worker.expected` for the fake ones.
"""
import inspect
import itertools
import time

import numpy as np
import pytest

from jaxrl_sys.rollout import (FinishReason, InProcessWorker, ManagerConfig, ManualClock,
                               MemoryWeightStore, RolloutClient, RolloutManager, RolloutSession,
                               ThreadWorker)
from tests.conftest import RAY_COMPILE_CACHE
from tests.rollout import common, fake_worker

_VERSIONS = itertools.count(1)  # Ray actors outlive a test: every manager publishes a newer one


class Backend:
  """Makes a manager over one kind of worker, requests and their reference responses."""

  def __init__(self, kind, ray_workers=None):
    self.kind, self.ray_workers = kind, ray_workers

  def client(self):
    if self.kind == "fake":
      clock = ManualClock()
      ws = [fake_worker.FakeWorker("f0", clock, latency=0.05, die_at=0.6),
            fake_worker.FakeWorker("f1", clock, latency=0.08),
            fake_worker.FakeWorker("f2", clock, latency=0.11, num_slots=2)]
      m = RolloutManager(ws, store=MemoryWeightStore(), clock=clock)
      m.publish({"w": np.zeros(1)}, next(_VERSIONS))
      return m
    if self.kind in ("inprocess", "thread"):
      cls = InProcessWorker if self.kind == "inprocess" else ThreadWorker
      ws = [cls(f"p{i}", common.CFG, common.engine_config()) for i in range(2)]
      m = RolloutManager(ws, config=ManagerConfig(theta=1))
    else:
      from jaxrl_sys.rollout.weights.ray import RayWeightStore  # pylint: disable=import-outside-toplevel
      for w in self.ray_workers:  # a previous test's manager may have left an exchange out
        while w.receive() is not None or w._ref is not None:  # pylint: disable=protected-access
          time.sleep(0.01)
      m = RolloutManager(self.ray_workers, store=RayWeightStore(),
                         config=ManagerConfig(theta=1))
    m.publish(common.params(), next(_VERSIONS))
    return m

  def requests(self, n, seed, first_id=0, min_version=-1):
    if self.kind == "fake":
      return fake_worker.make_requests(n, seed=seed, max_new=12, first_id=first_id,
                                       min_version=min_version)
    reqs = common.make_requests(n, seed=seed, group=2, first_id=first_id)
    for r in reqs:
      r.min_version = min_version
    return reqs

  def reference(self, reqs):
    if self.kind == "fake":
      return {r.request_id: fake_worker.expected(r) for r in reqs}
    return {rid: list(t) for rid, (t, _) in common.reference(reqs, common.SAMPLED).items()}


@pytest.fixture(scope="module")
def ray_workers(request):
  ray = request.getfixturevalue("ray_session")
  from jaxrl_sys.rollout.workers.ray import RayWorker  # pylint: disable=import-outside-toplevel
  ws = [RayWorker(f"r{i}", common.CFG, common.engine_config(), compile_cache=RAY_COMPILE_CACHE)
        for i in range(2)]
  yield ws
  for w in ws:
    w.kill()
  del ray


@pytest.fixture(params=["inprocess", "thread", "fake", "ray"])
def backend(request):
  if request.param == "ray":
    return Backend("ray", request.getfixturevalue("ray_workers"))
  return Backend(request.param)


def drain(client):
  out = []
  while client.num_pending():
    out += client.poll(min_count=1, timeout=30.0)
  return out


def check(out, ref):
  got = {c.request_id: list(c.request.tokens) for c in out}
  assert len(got) == len(out), "a request completed twice"
  assert got == ref


def test_surface_matches_the_protocol():
  names = [n for n in vars(RolloutSession) | vars(RolloutClient) if not n.startswith("_")]
  assert {"submit", "poll", "abort", "publish", "snapshot", "metrics", "close",
          "add_tick_hook"} <= set(names)
  for name in names:
    want = inspect.signature(getattr(RolloutSession, name))
    got = inspect.signature(getattr(RolloutManager, name))
    assert list(got.parameters) == list(want.parameters), name


def test_poll_min_count_and_timeout_zero(backend):
  client = backend.client()
  reqs = backend.requests(8, seed=31)
  client.submit(reqs)
  assert client.num_pending() == 8
  assert client.poll(timeout=0) == []  # nothing finished yet, nothing generated
  first = client.poll(min_count=3, timeout=60.0)
  assert len(first) >= 3 and client.num_pending() == 8 - len(first)
  out = first + drain(client)
  check(out, backend.reference(reqs))
  assert client.poll(timeout=0) == [] and client.num_pending() == 0
  for c in out:
    assert c.finish in (FinishReason.LENGTH, FinishReason.STOP)
    assert (c.request.versions == c.request.versions[0]).all()


def test_abort_returns_resumable_partial_state(backend):
  client = backend.client()
  reqs = backend.requests(8, seed=32)
  ref = backend.reference(reqs)
  client.submit(reqs)
  done = client.poll(min_count=1, timeout=60.0)
  partial = client.abort()
  done += client.poll(timeout=0)
  assert {r.request_id for r in partial}.isdisjoint(c.request_id for c in done)
  assert {r.request_id for r in partial} | {c.request_id for c in done} == set(ref)
  for r in partial:
    assert list(r.tokens) == ref[r.request_id][:r.num_generated]
  assert client.num_pending() == 0
  client.submit(partial)
  check(done + drain(client), ref)


def test_published_version_gates_and_tags_every_token(backend):
  client = backend.client()
  v = next(_VERSIONS)
  client.publish(common.params() if backend.kind != "fake" else {"w": np.zeros(1)}, v)
  reqs = backend.requests(6, seed=33, first_id=500, min_version=v)
  client.submit(reqs)
  out = drain(client)
  check(out, backend.reference(reqs))
  for c in out:
    assert (c.request.versions == v).all(), c.request.versions


def test_duplicate_ids_are_rejected(backend):
  client = backend.client()
  reqs = backend.requests(2, seed=34)
  client.submit(reqs)
  with pytest.raises(ValueError, match="already in flight"):
    client.submit(reqs[:1])
  drain(client)


def test_snapshot_does_not_stop_and_resumes_exactly(backend):
  client = backend.client()
  reqs = backend.requests(6, seed=35)
  ref = backend.reference(reqs)
  client.submit(reqs)
  done = client.poll(min_count=1, timeout=60.0)
  snap = client.snapshot()
  assert client.num_pending() == len(reqs) - len(done)
  for r in snap:
    assert list(r.tokens) == ref[r.request_id][:r.num_generated]
  check(done + drain(client), ref)  # the snapshot stopped nothing
  fresh = backend.client()
  fresh.submit(snap)
  resumed = {c.request_id: list(c.request.tokens) for c in drain(fresh)}
  assert resumed == {r.request_id: ref[r.request_id] for r in snap}

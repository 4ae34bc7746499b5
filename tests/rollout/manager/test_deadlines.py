"""Every wait of the manager ends: no weights, no workers, no progress, a pull that never
finishes, a corrupt tensorstore version (real files, bytes flipped) and weights that do not fit
the model all end in an error that names what was waited for, within a deadline."""
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys.rollout import (InProcessWorker, ManagerConfig, ManualClock, MemoryWeightStore,
                               RolloutManager, RolloutStalledError, WeightLoadError)
from jaxrl_sys.rollout.weights.tensorstore import TensorstoreWeightStore
from tests.rollout import common
from tests.rollout.fake_worker import FakeWorker, make_requests
from tests.rollout.manager.test_manager import check_complete, drain

TREE = {"w": np.arange(64 * 1024, dtype=np.float32), "b": np.ones((16,), np.float32)}


def flip_largest_file(version_dir: str) -> str:
  """Flips 16 bytes in the middle of the largest file of a stored version; returns its path."""
  files = [os.path.join(version_dir, f) for f in os.listdir(version_dir)]
  name = max(files, key=os.path.getsize)
  with open(name, "r+b") as f:
    f.seek(os.path.getsize(name) // 2)
    data = f.read(16)
    f.seek(os.path.getsize(name) // 2)
    f.write(bytes(b ^ 0xFF for b in data))
  return name


def test_poll_with_nothing_pending_returns_at_once():
  m = RolloutManager([])
  t0 = time.monotonic()
  assert m.poll() == [] and m.poll(min_count=3) == []
  assert time.monotonic() - t0 < 1.0


def test_poll_without_published_weights_is_an_error():
  clock = ManualClock()
  m = RolloutManager([FakeWorker("w0", clock)], store=MemoryWeightStore(), clock=clock)
  m.submit(make_requests(2))
  with pytest.raises(RolloutStalledError, match=r"2 requests pending but no weight version was "
                     r"published: call publish"):
    m.poll()


def test_poll_without_workers_is_an_error():
  m = RolloutManager([], clock=ManualClock())
  m.publish(TREE, 0)
  m.submit(make_requests(3))
  with pytest.raises(RolloutStalledError, match=r"3 requests pending and no workers"):
    m.poll(min_count=3)


def test_a_rollout_without_progress_ends_at_the_stall_timeout():
  clock = ManualClock()
  never = FakeWorker("w0", clock, load_delay=1e9)  # its pull never completes
  m = RolloutManager([never], config=ManagerConfig(stall_timeout=50.0), clock=clock)
  m.publish(TREE, 0)
  m.submit(make_requests(2))
  with pytest.raises(RolloutStalledError, match=r"no progress for 5\d s .*stall_timeout=50.*"
                     r"w0: v-1 holds 0"):
    m.poll()
  assert 50.0 < clock.now() < 52.0


def test_a_pull_that_never_finishes_fails_after_the_pull_timeout():
  clock = ManualClock()
  never = FakeWorker("w0", clock, load_delay=1e9)
  cfg = ManagerConfig(load_timeout=10.0, max_load_failures=1)
  m = RolloutManager([never], config=cfg, clock=clock)
  m.publish(TREE, 0)
  m.submit(make_requests(1))
  with pytest.raises(WeightLoadError, match=r"weight version 0 .*2 pulls failed .*not loaded "
                     r"within 10 s"):
    m.poll()
  assert 20.0 < clock.now() < 22.0


def test_a_corrupt_tensorstore_version_is_reported_and_workers_keep_the_good_one(tmp_path):
  clock = ManualClock()
  store = TensorstoreWeightStore(tmp_path)
  ws = [FakeWorker(f"w{i}", clock, load=True) for i in range(2)]
  m = RolloutManager(ws, store=store, config=ManagerConfig(max_load_failures=3), clock=clock)
  m.publish(TREE, 0)
  store.wait()
  first = make_requests(4, seed=1)
  m.submit(first)
  check_complete(drain(m), first)
  m.publish({"w": TREE["w"] + 1, "b": TREE["b"]}, 1)
  store.wait()
  flip_largest_file(os.path.join(tmp_path, "v1"))
  m.submit(make_requests(4, seed=2, min_version=1, first_id=10))
  t0 = clock.now()
  with pytest.raises(WeightLoadError) as err:
    for _ in range(1000):
      m.poll(min_count=1)
  msg = str(err.value)
  assert "weight version 1 could not be loaded" in msg and str(tmp_path) in msg, msg
  assert "4 pulls failed" in msg and "CorruptWeightsError" in msg, msg
  assert clock.now() - t0 < 5.0  # retried at once, never waited out a timeout
  assert sorted(w.version for w in m.fleet.values()) == [0, 0]  # the good version serves on
  assert m.fleet.stats.lost == 0  # a corrupt version is not the workers' fault
  m.close()


def test_a_corrupt_first_version_stops_a_real_worker_with_the_path(tmp_path):
  """The real worker path (`WorkerServer.load`: `WeightRef.load` + checksums) over real files."""
  store = TensorstoreWeightStore(tmp_path)
  m = RolloutManager([InProcessWorker("local-0", common.CFG, common.engine_config())],
                     store=store)
  m.publish(common.params(), 0)
  store.wait()
  flip_largest_file(os.path.join(tmp_path, "v0"))
  m.submit(common.make_requests(2))
  t0 = time.monotonic()
  with pytest.raises(WeightLoadError, match=r"weight version 0 could not be loaded from the "
                     r"weight store TensorstoreWeightStore\(.*" + os.path.basename(tmp_path) +
                     r".*CorruptWeightsError"):
    m.poll(timeout=60.0)
  assert time.monotonic() - t0 < 30.0
  m.close()


@pytest.mark.parametrize("damage,match", [
    ("int32", r"not floating point .*\['embed'\] int32"),
    ("shape", r"wrong shape: \['embed'\] \(64, 16\) \(model: \(64, 32\)\)"),
    ("tree", r"missing: \['final_norm'\]; not in the model: \['extra'\]")])
def test_weights_that_do_not_fit_the_model_are_named(damage, match):
  params = common.params()
  if damage == "int32":
    params = jax.tree.map(lambda x: x.astype(jnp.int32), params)
  elif damage == "shape":
    params = dict(params, embed=params["embed"][:, :16])
  else:
    params = dict(params, extra=jnp.zeros((2,)))
    del params["final_norm"]
  m = RolloutManager([InProcessWorker("local-0", common.CFG, common.engine_config())])
  m.publish(params, 0)
  m.submit(common.make_requests(1))
  with pytest.raises(WeightLoadError, match=r"weight version 0 could not be loaded .*"
                     r"WeightMismatchError: the weights of version 0 do not fit the model .*"
                     + match):
    m.poll(timeout=60.0)
  assert m.fleet["local-0"].version == -1  # never served

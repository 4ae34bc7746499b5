"""The Ray object-store weight store across a real actor process: bit-exact round trip with the
ref nested in an actor call argument, corruption detection, gc. Uses the session's Ray."""
import dataclasses
import os

import numpy as np
import ray
import pytest

from jaxrl_sys.rollout.weights import CorruptWeightsError, make_weight_store
from jaxrl_sys.rollout.weights.io import host_leaves
from tests.rollout.weights.test_weights import leaf_bytes, publish, tree



@pytest.fixture(scope="module")
def reader(ray_session):
  del ray_session  # started once per session

  @ray.remote(num_cpus=0)
  class Reader:
    """A worker stand-in: loads a ref that arrives inside a command-like argument."""

    def load(self, commands):
      ref = commands["load"]
      if not isinstance(ref.object_ref, ray.ObjectRef):
        return "Ray resolved the nested ref"
      try:
        return os.getpid(), leaf_bytes(ref.load())
      except CorruptWeightsError as e:
        return str(e)

  actor = Reader.remote()
  yield actor
  ray.kill(actor)


def test_round_trip_across_an_actor(reader):
  store = make_weight_store("ray")
  publish(store, 1, tree(1))
  publish(store, 2, tree(2))
  store.wait()
  pid, got = ray.get(reader.load.remote({"load": store.published(1)}))
  assert pid != os.getpid() and got == leaf_bytes(tree(1))
  assert ray.get(reader.load.remote({"load": store.published()}))[1] == leaf_bytes(tree(2))
  assert store.published(1).nbytes == sum(len(b) for *_, b in leaf_bytes(tree(1)))
  store.close()


def test_corruption_is_detected_in_the_actor(reader):
  store = make_weight_store("ray")
  params, moe = tree(3)
  store.publish(params, 3, moe)
  store.wait()
  ref = store.published(3)
  bad = dict(params, pos=params["pos"].copy())
  bad["pos"].view(np.uint8)[9] ^= 4
  swapped = dataclasses.replace(ref, object_ref=ray.put(host_leaves(bad, moe)[0]))
  msg = ray.get(reader.load.remote({"load": swapped}))
  assert isinstance(msg, str) and "version 3" in msg and "['pos'] bytes [0," in msg, msg
  short = host_leaves(dict(params, pos=params["pos"][:-1]), moe)[0]
  msg = ray.get(reader.load.remote({"load": dataclasses.replace(ref, object_ref=ray.put(short))}))
  assert isinstance(msg, str) and "['pos'] bytes [0," in msg and "crc32" in msg, msg


def test_gc_and_ordering(reader):  # pylint: disable=unused-argument
  store = make_weight_store("ray")
  for v in range(1, 5):
    publish(store, v, tree(v))
  with pytest.raises(ValueError, match="not newer than 4"):
    publish(store, 4, tree(4))
  store.wait()
  assert store.gc(in_use=[2]) == [1, 3]
  assert store.published(1) is None and store.published(3) is None and store.latest() == 4
  assert leaf_bytes(store.published(2).load()) == leaf_bytes(tree(2))

"""Weight stores: bit-exact round trips, atomic commits under a racing reader, corruption and
crash detection, gc, and the factory. References are the published arrays' own bytes."""
import json
import os
import pickle
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys.models.moe.block import MoEState
from jaxrl_sys.rollout.weights import io as weights_io
from jaxrl_sys.rollout.weights import kvstore as ts_kvstore
from jaxrl_sys.rollout.weights import tensorstore as ts_weights
from jaxrl_sys.rollout.weights.tensorstore import TensorstoreWeightStore, open_latest
from jaxrl_sys.rollout.weights import (CorruptWeightsError, MemoryWeightStore,
                                       WeightPublishError, make_weight_store)


def tree(seed: int, n: int = 4096):
  """(params, moe_state): float32 (with NaN payload and -0.0), bfloat16, int32, a None node and
  an MoEState, all derived from `seed`."""
  rng = np.random.default_rng(seed)
  f32 = rng.standard_normal((n // 64, 64)).astype(np.float32)
  f32.reshape(-1)[:3] = [np.float32(-0.0), np.float32(np.inf), np.float32(np.nan)]
  f32.view(np.uint32).reshape(-1)[3] = 0x7fc0beef  # a NaN with a payload
  params = {"embed": jnp.asarray(rng.standard_normal((16, 8)), jnp.bfloat16),
            "layers": [{"w": f32, "b": None}, {"w": jnp.asarray(f32[:2] * seed)}],
            "pos": rng.integers(-2**31, 2**31 - 1, (7,), dtype=np.int32)}
  moe = MoEState(bias=jnp.full((2, 3), seed, jnp.float32), q=jnp.zeros((2, 3)) - seed)
  return params, moe


def publish(store, version: int, t) -> None:
  """Publishes `t = (params, moe_state)` as `version`."""
  store.publish(t[0], version, t[1])


def leaf_bytes(t):
  """The independent reference: (path, dtype, shape, raw bytes) of every leaf, by hand."""
  out = []

  def walk(x, path):
    if x is None:
      return
    if isinstance(x, dict):
      for k in sorted(x):
        walk(x[k], f"{path}/{k}")
    elif isinstance(x, (list, tuple)):
      for i, y in enumerate(x):
        walk(y, f"{path}/{getattr(x, '_fields', range(len(x)))[i]}")
    else:
      a = np.asarray(x)
      out.append((path, a.dtype.name, a.shape, a.tobytes()))
  walk(t, "")
  return out


def assert_same(got, want):
  assert leaf_bytes(got) == leaf_bytes(want)
  assert type(got[1]) is type(want[1]) and got[0]["layers"][0]["b"] is None


@pytest.fixture(params=["file", "memory"])
def url(request, tmp_path):
  return str(tmp_path / "w") if request.param == "file" else f"memory://{tmp_path.name}/"


def test_round_trip_bit_exact(url):
  store = TensorstoreWeightStore(url)
  t1, t2 = tree(1), tree(2)
  publish(store, 1, t1)
  store.publish(t2[0], 2, None)
  store.wait()
  ref = pickle.loads(pickle.dumps(store.published(1)))  # what crosses to a worker process
  assert_same(ref.load(), t1)
  p, m = open_latest(url).load()
  assert m is None and leaf_bytes(p) == leaf_bytes(t2[0])
  assert store.published(2).nbytes == sum(len(b) for *_, b in leaf_bytes(t2[0]))
  store.close()


def test_publish_copies_and_commits_in_background(tmp_path, monkeypatch):
  store = TensorstoreWeightStore(tmp_path)
  gate = threading.Event()
  put = store._put
  monkeypatch.setattr(store, "_put", lambda k, v: (gate.wait(10), put(k, v))[1])
  params, moe = tree(3)
  want = leaf_bytes((params, moe))
  store.publish(params, 3, moe)  # returns while the writer is blocked
  params["layers"][0]["w"][:] = 0  # the caller reuses its buffer
  assert store.published(3) is None and store.latest() is None and open_latest(tmp_path) is None
  gate.set()
  store.wait()
  assert leaf_bytes(store.published(3).load()) == want and store.latest() == 3


def test_reader_racing_writer_never_sees_a_partial_version(tmp_path, monkeypatch):
  monkeypatch.setattr(weights_io, "CHUNK_BYTES", 1 << 16)  # many chunks per array
  expect = {v: leaf_bytes(tree(v, n=1 << 17)) for v in range(1, 16)}
  store = TensorstoreWeightStore(tmp_path)
  done, seen, errors = threading.Event(), [], []

  def writer():
    for v in expect:
      publish(store, v, tree(v, n=1 << 17))
      store.gc(in_use=[])  # deletes versions under the readers' feet
    store.wait()
    done.set()

  def reader():
    while not done.is_set():
      ref = open_latest(tmp_path)
      if ref is None:
        continue
      try:
        got = ref.load()
      except CorruptWeightsError as e:  # allowed only when gc won the race, i.e. v is not newest
        errors.append((ref.version, open_latest(tmp_path).version, str(e)))
        continue
      assert leaf_bytes(got) == expect[ref.version], ref.version
      seen.append(ref.version)

  threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert done.is_set() and len(set(seen)) >= 2, (seen, errors)
  assert all(v < newest and "missing" in e for v, newest, e in errors), errors
  assert leaf_bytes(open_latest(tmp_path).load()) == expect[15]


def _manifest(root, v):
  with open(os.path.join(root, f"v{v}", "manifest.json")) as f:
    return json.load(f)


def _array_file(root, v, path):
  key = next(a["key"] for a in _manifest(root, v)["arrays"] if a["path"] == path)
  return os.path.join(root, f"v{v}", key)


def _flip(name, offset):
  with open(name, "r+b") as f:
    f.seek(offset)
    b = f.read(1)
    f.seek(offset)
    f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("damage,match", [
    ("flip", r"version 1 .*\[0\]\['layers'\]\[0\]\['w'\] bytes \[2048, .*crc32"),
    ("truncate", r"version 1 .*\[0\]\['layers'\]\[0\]\['w'\] is truncated"),
    ("delete_array", r"version 1 .*\[0\]\['layers'\]\[0\]\['w'\] is missing"),
    ("delete_manifest", r"version 1 .*manifest.json is missing"),
    ("edit_manifest", r"version 1 .*manifest.json fails its crc32")])
def test_damage_is_detected(tmp_path, monkeypatch, damage, match):
  monkeypatch.setattr(weights_io, "CHUNK_BYTES", 1024)
  store = TensorstoreWeightStore(tmp_path)
  publish(store, 1, tree(1))
  store.wait()
  ref = store.published(1)
  name = _array_file(tmp_path, 1, "[0]['layers'][0]['w']")
  mpath = os.path.join(tmp_path, "v1", "manifest.json")
  if damage == "flip":
    _flip(name, 2048 + 77)  # the third 1 KiB chunk
  elif damage == "truncate":
    os.truncate(name, os.path.getsize(name) - 1)
  elif damage == "delete_array":
    os.remove(name)
  elif damage == "delete_manifest":
    os.remove(mpath)
  else:
    _flip(mpath, 20)
  with pytest.raises(CorruptWeightsError, match=match):
    ref.load()


def test_damage_is_detected_on_other_kvstores(tmp_path):
  url = f"memory://{tmp_path.name}/"
  store = TensorstoreWeightStore(url)
  publish(store, 1, tree(1))
  store.wait()
  kv = ts_kvstore.open_kvstore(store.url)
  m = json.loads(kv["v1/manifest.json"])
  key = "v1/" + next(a["key"] for a in m["arrays"] if a["path"] == "[1].q")
  value = bytearray(kv[key])
  value[5] ^= 1
  kv[key] = bytes(value)
  with pytest.raises(CorruptWeightsError, match=r"version 1 .*\[1\]\.q bytes \[0,.*crc32"):
    store.published(1).load()
  kv[key] = bytes(value[:-4])
  with pytest.raises(CorruptWeightsError, match=r"\[1\]\.q is truncated \(20 of 24 bytes\)"):
    store.published(1).load()


@pytest.mark.parametrize("fail_at", ["v2/a1", "v2/manifest.json", "LATEST"])
def test_crash_mid_publish_never_moves_latest(tmp_path, monkeypatch, fail_at):
  store = TensorstoreWeightStore(tmp_path)
  publish(store, 1, tree(1))
  store.wait()
  put = store._put

  def failing(key, value):
    if key == fail_at:
      raise OSError(f"disk full writing {key}")
    return put(key, value)
  monkeypatch.setattr(store, "_put", failing)
  publish(store, 2, tree(2))
  with pytest.raises(WeightPublishError, match=f"version 2 .*disk full writing {fail_at}"):
    store.wait()
  assert store.published(2) is None and store.latest() == 1
  assert open_latest(tmp_path).version == 1
  assert_same(open_latest(tmp_path).load(), tree(1))
  store.wait()  # the failure is reported once
  # The failed publish deleted what it wrote (issue 44: no partial version left).
  assert sorted(os.listdir(tmp_path)) == ["LATEST", "v1"]
  # A killed trainer cannot clean up: a restarted one resumes at version 1 and its gc deletes
  # the half-written version 2.
  os.makedirs(tmp_path / "v2")
  (tmp_path / "v2" / "a0").write_bytes(b"half")
  monkeypatch.undo()
  again = TensorstoreWeightStore(tmp_path)
  assert again.latest() == 1 and again.published(2) is None
  publish(again, 3, tree(3))
  again.wait()
  assert again.gc(in_use=[]) == [1, 2]
  assert sorted(os.listdir(tmp_path)) == ["LATEST", "v3"]
  assert_same(again.published().load(), tree(3))


def test_gc_keeps_newest_and_in_use(tmp_path):
  store = TensorstoreWeightStore(tmp_path)
  for v in range(1, 5):
    publish(store, v, tree(v))
  store.wait()
  old = store.published(1)
  assert store.gc(in_use=[2]) == [1, 3]
  assert store.published(1) is None and store.published(3) is None and store.latest() == 4
  assert sorted(os.listdir(tmp_path)) == ["LATEST", "v2", "v4"]
  assert_same(store.published(2).load(), tree(2))
  with pytest.raises(CorruptWeightsError, match="version 1 .*missing"):
    old.load()  # a reader holding a collected version fails cleanly
  assert store.gc(in_use=[]) == [2] and store.gc(in_use=[]) == []
  assert_same(store.published(4).load(), tree(4))


def test_reopen_resumes_versions(tmp_path):
  first = TensorstoreWeightStore(tmp_path)
  publish(first, 1, tree(1))
  publish(first, 2, tree(2))
  first.close()
  store = TensorstoreWeightStore(tmp_path)
  assert store.latest() == 2
  assert_same(store.published(1).load(), tree(1))  # its ref is rebuilt from the manifest
  publish(store, 3, tree(3))
  with pytest.raises(ValueError, match="not newer than 3"):  # increasing within one opening
    publish(store, 3, tree(3))
  store.close()
  # A run resumed from an earlier checkpoint publishes version 2 again (issue 44: refused,
  # "weight version 2 is not newer than 3"): versions 2 and 3 of the earlier opening are dropped.
  resumed = TensorstoreWeightStore(tmp_path)
  publish(resumed, 2, tree(7))
  resumed.wait()
  assert resumed.latest() == 2 and open_latest(tmp_path).version == 2
  assert_same(resumed.published(2).load(), tree(7))
  assert sorted(os.listdir(tmp_path)) == ["LATEST", "v1", "v2"]


def test_memory_store_is_zero_copy_and_refuses_to_pickle():
  store = MemoryWeightStore()
  params, moe = tree(1)
  store.publish(params, 1, moe)
  p, m = store.published(1).load()
  assert p is params and m is moe
  with pytest.raises(TypeError, match="only serves workers in the trainer's process.*ray"):
    pickle.dumps(store.published(1))


def test_factory(tmp_path, monkeypatch):
  assert isinstance(make_weight_store("memory"), MemoryWeightStore)
  store = make_weight_store(f"tensorstore:{tmp_path}")
  assert isinstance(store, TensorstoreWeightStore) and store.url == f"file://{tmp_path}/"
  for bad in ["tensorstore:", "s3", "Memory"]:
    with pytest.raises(ValueError, match="use 'memory', 'ray' or 'tensorstore:PATH_OR_URL'"):
      make_weight_store(bad)
  monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
  with pytest.raises(ImportError, match=r"pip install -e \.\[ray\]"):
    make_weight_store("ray")



def test_a_store_that_does_not_answer_fails_within_its_deadline(tmp_path, monkeypatch):
  """Issue 44: tensorstore retries an unreachable endpoint (gs:// without credentials) for
  minutes; every operation has a deadline, and a failed publish leaves no partial version."""
  import concurrent.futures as cf  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(ts_kvstore, "REMOTE_TIMEOUT_S", 0.2)

  class Silent:  # a kvstore whose operations never finish
    def __getattr__(self, name):
      return lambda *a, **k: cf.Future()
  monkeypatch.setitem(ts_kvstore._KVSTORES, "gs://nowhere/w/", Silent())
  with pytest.raises(ts_weights.WeightStoreUnreachableError,
                     match=r"gs://nowhere/w/ did not answer within 0.2 s \(reading LATEST\).*"
                           "credentials"):
    TensorstoreWeightStore("gs://nowhere/w")
  # The local operations around the silent write keep a deadline that a loaded machine meets.
  monkeypatch.setattr(ts_kvstore, "REMOTE_TIMEOUT_S", 1.0)
  store = TensorstoreWeightStore(tmp_path)
  put = store._put
  monkeypatch.setattr(store, "_put", lambda k, v: cf.Future() if k == "v1/a1" else put(k, v))
  publish(store, 1, tree(1))
  with pytest.raises(WeightPublishError, match=r"version 1 .*did not answer .*writing v1/a1"):
    store.wait()
  assert store.latest() is None and os.listdir(tmp_path) == []


def test_a_full_disk_fails_the_publish_and_leaves_no_partial_version(tmp_path):
  from tests.full_disk import full_disk  # pylint: disable=import-outside-toplevel
  big = {"w": np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)}  # 1 MiB
  with full_disk(tmp_path / "disk", "300k") as disk:
    store = TensorstoreWeightStore(disk)
    store.publish(big, 1)
    with pytest.raises(WeightPublishError, match="version 1 .*No space left on device"):
      store.wait()
    assert os.listdir(disk) == [] and store.latest() is None

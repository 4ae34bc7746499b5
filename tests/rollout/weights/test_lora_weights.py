"""LoRA versions in the weight stores and workers: a version holds the adapters and names its
base; the base is stored once per digest and pulled once per worker (or read from a local
Hugging Face directory whose digest matches); a base mismatch is a clear error. References:
the published arrays' own bytes and sizes."""
import dataclasses
import os

import jax
import numpy as np
import pytest

from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import LoraConfig
from jaxrl_sys.rollout.engine.check import WeightMismatchError
from jaxrl_sys.rollout.weights import BaseWeights, MemoryWeightStore
from jaxrl_sys.rollout.weights.tensorstore import TensorstoreWeightStore, open_latest
from jaxrl_sys.rollout.workers.protocol import Commands
from jaxrl_sys.rollout.workers.server import WorkerServer
from tests.rollout.common import CFG, engine_config, params

# Llama: its HF export imports back as the same parameter tree (a local base directory).
BASE_CFG = dataclasses.replace(CFG, architecture="LlamaForCausalLM")
LORA_CFG = dataclasses.replace(BASE_CFG, lora=LoraConfig(rank=4))


def _adapters(seed):
  ad = lora_lib.init_lora(LORA_CFG, jax.random.key(seed))
  return jax.tree.map(lambda x: np.asarray(x) + seed, ad)


def _same(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(la, lb))


def _base_dirs(root):
  return sorted(os.listdir(os.path.join(root, "base"))) if os.path.isdir(
      os.path.join(root, "base")) else []


def test_tensorstore_keeps_one_base_per_digest(tmp_path):
  base = jax.tree.map(np.asarray, params(0))
  digest = lora_lib.base_digest(base)
  store = TensorstoreWeightStore(tmp_path)
  for v in range(3):
    store.publish(_adapters(v), v, None, base=BaseWeights(digest, base))
  store.wait()
  assert _base_dirs(tmp_path) == [digest]
  for v in range(3):
    ref = store.published(v)
    assert ref.nbytes == lora_lib.nbytes(_adapters(v)) and ref.base.digest == digest
    assert ref.base.nbytes == lora_lib.nbytes(base)
    assert _same(ref.load()[0], _adapters(v)) and _same(ref.base.load(), base)
  # A reopened store and a worker that starts on its own find the base too.
  again = TensorstoreWeightStore(tmp_path)
  assert again.published(1).base.digest == digest and _same(again.published(1).base.load(), base)
  assert open_latest(tmp_path).base.digest == digest
  # Another base: stored beside the first, named by the versions that use it.
  other = jax.tree.map(lambda x: x + 1, base)
  again.publish(_adapters(3), 3, None, base=BaseWeights(lora_lib.base_digest(other), other))
  again.wait()
  assert len(_base_dirs(tmp_path)) == 2 and _same(again.published(3).base.load(), other)
  # Full-weight versions carry no base.
  store.close()
  plain = TensorstoreWeightStore(tmp_path / "plain")
  plain.publish(base, 0)
  plain.wait()
  assert plain.published(0).base is None


def test_memory_store_shares_the_base():
  base = params(0)
  store = MemoryWeightStore()
  store.publish(_adapters(0), 0, base=BaseWeights("d0", base))
  store.publish(_adapters(1), 1, base=BaseWeights("d0", base))
  assert store.published(0).base is store.published(1).base
  assert store.published(1).base.load() is base
  assert store.published(1).nbytes == lora_lib.nbytes(_adapters(1))


def _pull(server, ref):
  server.apply(Commands(load=ref))
  rep = server.report()
  assert not rep.failed_loads, rep.failed_loads
  return rep


def test_worker_pulls_the_base_once_then_adapters_only(tmp_path):
  from jaxrl_sys.models.hf.checkpoint import save_hf_checkpoint

  base = jax.tree.map(np.asarray, params(0))
  digest = lora_lib.base_digest(base)
  store = TensorstoreWeightStore(tmp_path / "w")
  for v in range(3):
    store.publish(_adapters(v), v, None, base=BaseWeights(digest, base))
  store.wait()
  ad_bytes, base_bytes = lora_lib.nbytes(_adapters(0)), lora_lib.nbytes(base)
  worker = WorkerServer("w", LORA_CFG, engine_config())
  got = [_pull(worker, store.published(v)).load_bytes for v in range(3)]
  assert got == [[(0, ad_bytes + base_bytes)], [(1, ad_bytes)], [(2, ad_bytes)]]
  assert worker.engine.version == 2 and _same(worker.engine.params, _adapters(2))
  assert _same(worker.engine.base, base) and worker.base_digest == digest
  # A worker with the base on local disk (a Hugging Face directory): adapters only.
  hf = str(tmp_path / "hf")
  save_hf_checkpoint(hf, BASE_CFG, base)
  local = WorkerServer("l", LORA_CFG, engine_config(), base_path=hf)
  assert _pull(local, store.published(2)).load_bytes == [(2, ad_bytes)]
  assert _same(local.engine.base, base)
  # A local directory holding another base: noted, and the right one pulled from the store.
  save_hf_checkpoint(hf, BASE_CFG, jax.tree.map(lambda x: x * 2, base))
  other = WorkerServer("o", LORA_CFG, engine_config(), base_path=hf)
  rep = _pull(other, store.published(2))
  assert rep.load_bytes == [(2, ad_bytes + base_bytes)] and _same(other.engine.base, base)
  assert "not the trainer's" in rep.notes[0]


def test_base_mismatch_is_a_clear_error(tmp_path):
  base = params(0)
  store = MemoryWeightStore()
  store.publish(base, 0)                                        # full weights
  store.publish(_adapters(1), 1, base=BaseWeights("d", base))   # adapters
  with pytest.raises(WeightMismatchError, match="holds full weights but worker w runs a LoRA"):
    WorkerServer("w", LORA_CFG, engine_config()).load(store.published(0))
  with pytest.raises(WeightMismatchError, match="holds LoRA adapters .base d. but worker w"):
    WorkerServer("w", CFG, engine_config()).load(store.published(1))
  wrong = dataclasses.replace(LORA_CFG, lora=LoraConfig(rank=8))
  with pytest.raises(WeightMismatchError, match="do not fit --lora.rank=8"):
    WorkerServer("w", wrong, engine_config()).load(store.published(1))


def test_the_manager_counts_the_bytes_each_worker_loads():
  """The manager's event core adds each report's load bytes: a worker that joins at version 1
  loads base + adapters, then adapters only (reference: the published arrays' own bytes)."""
  from jaxrl_sys.rollout import InProcessWorker, RolloutManager  # pylint: disable=import-outside-toplevel
  from tests.rollout.common import make_requests  # pylint: disable=import-outside-toplevel

  base = jax.tree.map(np.asarray, params(0))
  named = BaseWeights(lora_lib.base_digest(base), base)
  m = RolloutManager([InProcessWorker("a", LORA_CFG, engine_config())],
                     store=MemoryWeightStore())
  for v in range(3):
    if v == 1:
      m.add_worker(InProcessWorker("b", LORA_CFG, engine_config()))
    m.publish(_adapters(v), v, base=named)
    reqs = make_requests(4, seed=v, first_id=10 * v)
    for r in reqs:
      r.min_version = v
    m.submit(reqs)
    assert len(m.poll(min_count=4, timeout=60)) == 4
  ad, full = lora_lib.nbytes(_adapters(0)), lora_lib.nbytes(_adapters(0)) + lora_lib.nbytes(base)
  loads = {w: [int(e[3].split()[1]) for e in m.fleet.events if e[1] == "load_bytes" and e[2] == w]
           for w in ("a", "b")}
  assert loads["a"][0] == full and loads["b"][0] == full
  assert all(n == ad for n in loads["a"][1:] + loads["b"][1:]) and len(loads["a"]) == 3
  assert m.metrics()["load_bytes"] == m.fleet.stats.load_bytes == sum(map(sum, loads.values()))
  m.close()

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
    store.publish(v, _adapters(v), None, base=BaseWeights(digest, base))
  store.wait()
  assert _base_dirs(tmp_path) == [digest]
  for v in range(3):
    ref = store.ref(v)
    assert ref.nbytes == lora_lib.nbytes(_adapters(v)) and ref.base.digest == digest
    assert ref.base.nbytes == lora_lib.nbytes(base)
    assert _same(ref.fetch()[0], _adapters(v)) and _same(ref.base.fetch(), base)
  # A reopened store and a worker that starts on its own find the base too.
  again = TensorstoreWeightStore(tmp_path)
  assert again.ref(1).base.digest == digest and _same(again.ref(1).base.fetch(), base)
  assert open_latest(tmp_path).base.digest == digest
  # Another base: stored beside the first, named by the versions that use it.
  other = jax.tree.map(lambda x: x + 1, base)
  again.publish(3, _adapters(3), None, base=BaseWeights(lora_lib.base_digest(other), other))
  again.wait()
  assert len(_base_dirs(tmp_path)) == 2 and _same(again.ref(3).base.fetch(), other)
  # Full-weight versions carry no base.
  store.close()
  plain = TensorstoreWeightStore(tmp_path / "plain")
  plain.publish(0, base)
  plain.wait()
  assert plain.ref(0).base is None


def test_memory_store_shares_the_base():
  base = params(0)
  store = MemoryWeightStore()
  store.publish(0, _adapters(0), base=BaseWeights("d0", base))
  store.publish(1, _adapters(1), base=BaseWeights("d0", base))
  assert store.ref(0).base is store.ref(1).base and store.ref(1).base.fetch() is base
  assert store.ref(1).nbytes == lora_lib.nbytes(_adapters(1))


def _pull(server, ref):
  server.apply(Commands(load=ref))
  rep = server.report()
  assert not rep.failed_pulls, rep.failed_pulls
  return rep


def test_worker_pulls_the_base_once_then_adapters_only(tmp_path):
  from jaxrl_sys.models.hf.checkpoint import save_hf_checkpoint

  base = jax.tree.map(np.asarray, params(0))
  digest = lora_lib.base_digest(base)
  store = TensorstoreWeightStore(tmp_path / "w")
  for v in range(3):
    store.publish(v, _adapters(v), None, base=BaseWeights(digest, base))
  store.wait()
  ad_bytes, base_bytes = lora_lib.nbytes(_adapters(0)), lora_lib.nbytes(base)
  worker = WorkerServer("w", LORA_CFG, engine_config())
  got = [_pull(worker, store.ref(v)).pulled_bytes for v in range(3)]
  assert got == [[(0, ad_bytes + base_bytes)], [(1, ad_bytes)], [(2, ad_bytes)]]
  assert worker.engine.version == 2 and _same(worker.engine.params, _adapters(2))
  assert _same(worker.engine.base, base) and worker.base_digest == digest
  # A worker with the base on local disk (a Hugging Face directory): adapters only.
  hf = str(tmp_path / "hf")
  save_hf_checkpoint(hf, BASE_CFG, base)
  local = WorkerServer("l", LORA_CFG, engine_config(), base_path=hf)
  assert _pull(local, store.ref(2)).pulled_bytes == [(2, ad_bytes)]
  assert _same(local.engine.base, base)
  # A local directory holding another base: noted, and the right one pulled from the store.
  save_hf_checkpoint(hf, BASE_CFG, jax.tree.map(lambda x: x * 2, base))
  other = WorkerServer("o", LORA_CFG, engine_config(), base_path=hf)
  rep = _pull(other, store.ref(2))
  assert rep.pulled_bytes == [(2, ad_bytes + base_bytes)] and _same(other.engine.base, base)
  assert "not the trainer's" in rep.notes[0]


def test_base_mismatch_is_a_clear_error(tmp_path):
  base = params(0)
  store = MemoryWeightStore()
  store.publish(0, base)                                        # full weights
  store.publish(1, _adapters(1), base=BaseWeights("d", base))   # adapters
  with pytest.raises(WeightMismatchError, match="holds full weights but worker w runs a LoRA"):
    WorkerServer("w", LORA_CFG, engine_config()).pull(store.ref(0))
  with pytest.raises(WeightMismatchError, match="holds LoRA adapters .base d. but worker w"):
    WorkerServer("w", CFG, engine_config()).pull(store.ref(1))
  wrong = dataclasses.replace(LORA_CFG, lora=LoraConfig(rank=8))
  with pytest.raises(WeightMismatchError, match="do not fit --lora.rank=8"):
    WorkerServer("w", wrong, engine_config()).pull(store.ref(1))

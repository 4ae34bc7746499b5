"""LoRA on Ray workers: a worker that joins mid-run pulls the base once, then adapters only;
every later pull moves the adapters' bytes. Prints the adapters' share of the model's bytes for
the tiny presets and a Qwen2.5-0.5B-shaped model (rank 8 on attention + MLP: at most 2%)."""
import dataclasses
import re
import time

import jax
import numpy as np

from jaxrl_sys import models
from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import LoraConfig
from jaxrl_sys.rollout import ManagerConfig, RolloutManager
from jaxrl_sys.rollout.weights import BaseWeights
from jaxrl_sys.train.recipe.presets import load_model
from tests.conftest import RAY_COMPILE_CACHE
from tests.rollout import common

LORA_CFG = dataclasses.replace(common.CFG, lora=LoraConfig(rank=4))
# Qwen2.5-0.5B's shapes (tied embeddings, q/k/v biases).
QWEN_05B = models.ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                              num_kv_heads=2, head_dim=64, intermediate_size=4864,
                              tie_embeddings=True, attention_bias=True)


def share(config: models.ModelConfig, lora: LoraConfig) -> float:
  """Adapter bytes / model bytes, both in one dtype (shapes only: nothing is allocated)."""
  mc = dataclasses.replace(config, lora=lora)
  base = jax.eval_shape(lambda: models.init_params(config, jax.random.key(0)))
  ad = jax.eval_shape(lambda: lora_lib.init_lora(mc, jax.random.key(0)))
  return lora_lib.nbytes(ad) / lora_lib.nbytes(base)


def _adapters(version):
  ad = lora_lib.init_lora(LORA_CFG, jax.random.key(version))
  return jax.tree.map(lambda x: np.asarray(x) + 0.01 * version, ad)


def _pulls(manager, worker_id):
  return [tuple(int(x) for x in re.fullmatch(r"v(\d+) (\d+)", e[3]).groups())
          for e in manager.fleet.events if e[1] == "load_bytes" and e[2] == worker_id]


def test_worker_joining_mid_run_pulls_the_base_once_then_adapters(ray_session, capsys):  # pylint: disable=unused-argument
  from jaxrl_sys.rollout.weights.ray import RayWeightStore  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.workers.ray import RayWorker  # pylint: disable=import-outside-toplevel

  def worker(name):
    return RayWorker(name, LORA_CFG, common.engine_config(), compile_cache=RAY_COMPILE_CACHE)

  base = jax.tree.map(np.asarray, common.params(0))
  named = BaseWeights(lora_lib.base_digest(base), base)
  m = RolloutManager([worker("r0")], store=RayWeightStore(),
                     config=ManagerConfig(theta=1, heartbeat_timeout=30.0, balance=False))
  version = 0

  def step(n=6):
    nonlocal version
    version += 1
    m.publish(_adapters(version), version, base=named)
    reqs = common.make_requests(n, seed=version, first_id=100 * version)
    for r in reqs:
      r.min_version = version
    m.submit(reqs)
    out, deadline = [], time.monotonic() + 180
    while m.num_pending() and time.monotonic() < deadline:
      out += m.poll(min_count=1, timeout=0.2)
    assert len(out) == n
    return out

  step()
  step()
  m.add_worker(worker("r1"))  # joins mid-run, at version 2
  deadline = time.monotonic() + 180
  while m.fleet["r1"].version < 0 and time.monotonic() < deadline:
    if not m.round():  # exchange rounds (poll returns at once with nothing pending)
      time.sleep(0.05)  # r1 starts and loads the newest version
  assert m.fleet["r1"].version == 2
  for _ in range(2):
    out = step()
  m.close()
  ad_bytes, base_bytes = lora_lib.nbytes(_adapters(1)), lora_lib.nbytes(base)
  # The manager's metrics count every load's bytes (the trainer's weight_pull_bytes).
  assert m.metrics()["load_bytes"] == sum(b for w in ("r0", "r1") for _, b in _pulls(m, w))
  for wid in ("r0", "r1"):
    pulls = _pulls(m, wid)
    assert len(pulls) >= 2, (wid, pulls)
    assert pulls[0][1] == ad_bytes + base_bytes        # the base, once, with the first version
    assert all(b == ad_bytes for _, b in pulls[1:])    # then the adapters only
  assert {c.request.versions[-1] for c in out} == {version}
  lines = [f"one later pull: {ad_bytes} B of adapters, the full model {base_bytes} B "
           f"({ad_bytes / base_bytes:.1%}; rank 4 on attention + MLP of the test model)"]
  for name in ("tiny", "tiny_moe"):
    mc = load_model(name).config
    lines.append(f"{name}: rank 8 on attention + MLP: adapters are "
                 f"{share(mc, LoraConfig(rank=8)):.1%} of the model's bytes")
  qwen = share(QWEN_05B, LoraConfig(rank=8, targets="attention,mlp"))
  lines.append(f"Qwen2.5-0.5B shapes: rank 8 on attention + MLP: {qwen:.2%} of the model's bytes")
  with capsys.disabled():
    print("\n" + "\n".join(lines))
  assert qwen <= 0.02

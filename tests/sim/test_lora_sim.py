"""The simulator with LoRA (adapter-only weight sync): adapter bytes sized as `models.lora`
sizes them (an independent count: the adapter tree's shapes), and a spot instance pulls the
base with its first version, then adapters only."""
import dataclasses

import jax

from jaxrl_sys import models
from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import LoraConfig
from jaxrl_sys.rollout.clock import ManualClock
from jaxrl_sys.sim.cluster import SimCluster
from jaxrl_sys.sim.engine import EngineModel
from jaxrl_sys.sim.presets import QWEN3_8B, QWEN3_8B_ARCH, with_lora


def test_adapter_bytes_match_the_adapter_tree():
  a = QWEN3_8B_ARCH
  mc = models.ModelConfig(vocab_size=151936, hidden_size=a.hidden, num_layers=a.num_layers,
                          num_heads=a.num_heads, num_kv_heads=a.num_kv_heads,
                          head_dim=a.head_dim, intermediate_size=a.intermediate,
                          param_dtype="bfloat16")
  for targets in ("attention,mlp", "q,v"):
    lc = dataclasses.replace(mc, lora=LoraConfig(rank=16, targets=targets))
    shapes = jax.eval_shape(lambda c=lc: lora_lib.init_lora(c, jax.random.key(0)))
    assert a.lora_bytes(16, targets) == lora_lib.nbytes(shapes)
  base = jax.eval_shape(lambda: models.init_params(mc, jax.random.key(0)))
  assert abs(lora_lib.nbytes(base) - a.weight_bytes) < 1e-3 * a.weight_bytes


def test_first_pull_moves_the_base_then_adapters_only():
  preset = with_lora(QWEN3_8B, 16)
  assert preset.name == "qwen3-8b+lora16" and 0 < preset.adapter_bytes < 0.01 * preset.weight_bytes
  cluster = SimCluster(ManualClock(), preset, EngineModel())
  w = cluster.make_local("w")
  assert cluster.pull_bytes(w) == preset.weight_bytes + preset.adapter_bytes
  w.version = 3
  assert cluster.pull_bytes(w) == preset.adapter_bytes
  full = SimCluster(ManualClock(), QWEN3_8B, EngineModel())
  assert full.pull_bytes(w) == QWEN3_8B.weight_bytes

"""Startup delay of a new preemptible rollout instance, before its first weight pull.

Not published by RLBoost (its replayer runs on machines it already holds, RLBOOST.md
1.7), so the phases below are stated assumptions; the weight pull itself is
`network.weight_pull_time` (RLBoost's engines start without weights and pull them).

- `COLD_VM` (a new spot VM): provisioning + OS boot 60 s, container start + Python imports
  30 s, engine init (device memory, KV cache allocation, CUDA-graph capture) 30 s: 120 s.
- `WARM_RESTART` (a new engine process on a machine already up, as in a trace replay on held
  machines): 30 s of engine init.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Startup:
  """Phases (seconds) from "instance granted" to "engine ready to pull weights".

  Attributes:
    provision_s: VM allocation and OS boot.
    container_s: container start and imports.
    engine_init_s: engine start (memory pools, KV cache, compiled graphs).
    jitter: relative spread; a sampled delay is the total times U[1 - jitter, 1 + jitter].
  """
  provision_s: float = 60.0
  container_s: float = 30.0
  engine_init_s: float = 30.0
  jitter: float = 0.0

  def __post_init__(self):
    if min(self.provision_s, self.container_s, self.engine_init_s) < 0 or \
        not 0 <= self.jitter < 1:
      raise ValueError(f"Startup: phases must be >= 0 and 0 <= jitter < 1, got {self}")

  @property
  def total_s(self) -> float:
    return self.provision_s + self.container_s + self.engine_init_s


COLD_VM = Startup()
WARM_RESTART = Startup(provision_s=0.0, container_s=0.0, engine_init_s=30.0)


def startup_delay(startup: Startup = COLD_VM, rng: np.random.Generator | None = None) -> float:
  """Seconds before a new instance can pull weights: the total, or with `rng` a seeded draw
  spread by `startup.jitter`."""
  if rng is None or startup.jitter == 0:
    return startup.total_s
  return startup.total_s * float(rng.uniform(1 - startup.jitter, 1 + startup.jitter))

"""The in-process rollout clients: a `RolloutManager` over engines on this process's devices.

`local_client`: one `InProcessWorker` (an accelerator runs one engine's batch best).
`thread_client`: `ThreadWorker`s splitting the engine config's decode slots, generating side
by side on threads of their own (a CPU host: one engine's small decode ops leave a core idle a
third of the time there; see `rollout.workers.thread`). `local_worker_count` picks how many.

Both start with no weights: the caller publishes them (`RolloutSession.publish`); the weight
store is the in-memory one, which shares the published arrays with the engines (zero copy).
"""
from __future__ import annotations

import dataclasses
import threading

from jaxrl_sys import backend
from jaxrl_sys.models import ModelConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.setup.spec import ClientOptions, RolloutSetup
from jaxrl_sys.rollout.workers.server import InProcessWorker
from jaxrl_sys.rollout.workers.thread import ThreadWorker

# Auto mode splits the in-process rollout over two engines only when each keeps this many slots.
MIN_SLOTS_PER_LOCAL_WORKER = backend.MIN_SLOTS_PER_LOCAL_ENGINE


def local_worker_count(requested: int, num_slots: int) -> int:
  """Engines of the in-process rollout: `requested` (at most one per slot), or for 0 (auto)
  two on a CPU host with at least two cores when each keeps at least
  `MIN_SLOTS_PER_LOCAL_WORKER` slots, else one (`backend.local_engine_count`)."""
  return backend.local_engine_count(requested, num_slots)


def local_client(setup: RolloutSetup, model_config: ModelConfig, engine_config: EngineConfig, *,
                 options: ClientOptions = ClientOptions(), clock: Clock = WALL) -> RolloutManager:
  """A `RolloutManager` over one `InProcessWorker` ("local-0") on this process's devices."""
  worker = InProcessWorker("local-0", model_config, engine_config, warmup=options.warmup)
  return RolloutManager([worker], config=setup.manager_config(), clock=clock)


def thread_client(setup: RolloutSetup, model_config: ModelConfig, engine_config: EngineConfig, *,
                  options: ClientOptions = ClientOptions(), clock: Clock = WALL
                  ) -> RolloutManager:
  """A `RolloutManager` over `options.local_workers` `ThreadWorker`s ("local-0", ...) sharing
  `engine_config`'s slots evenly (each engine's row buckets follow its own slots)."""
  n = options.local_workers
  part = dataclasses.replace(engine_config, num_slots=-(-engine_config.num_slots // n),
                             decode_row_buckets=())
  first_load = threading.Lock()
  workers = [ThreadWorker(f"local-{i}", model_config, part, warmup=options.warmup,
                          first_load=first_load) for i in range(n)]
  # Equal engines: no measured plateau (a timing) decides a move, so a run repeats exactly;
  # an idle engine still takes half of the other's last running requests (tail balancing).
  config = dataclasses.replace(setup.manager_config(), plateau_batch=part.num_slots)
  return RolloutManager(workers, config=config, clock=clock)

"""jaxrl_sys.rollout: records, the generation engine, workers, the rollout manager, weights.

- `types`: `Request`, `TokenChunk`, `Completion`, `FinishReason`, `request_key`,
  `RolloutClient` (the contract between trainer, manager and engines).
- `Engine(model_config, params, EngineConfig(...), version)`: continuous batching over fixed
  slots, shared-prompt prefill, token streaming, resumable requests, abort, weight swap.
- `InProcessRollout.create(...)`: a RolloutClient over one engine in this process (no manager).
- `RolloutManager(workers, store, ManagerConfig(...), clock)`: the RolloutClient over workers
  that come and go: token-level state, routing with version gating, migration on loss,
  continuous load balancing, weight pulls (`manager`, `manager_state`, `balance`).
- Workers (`worker`): the `Worker` protocol (`Commands` in, `WorkerReport` out, `WorkerLost`),
  `WorkerServer` (engine side), `InProcessWorker`; `ThreadWorker` (`thread_worker`: engines of
  this process on threads of their own, side by side); Ray actors in `ray_worker` (imports Ray).
- Weights (`weights`): `WeightStore` / `WeightRef` protocols, `MemoryWeightStore`.
- `clock`: `Clock`, `WallClock`, `ManualClock` (time is injected everywhere above).
- `wire`: exact JSON encoding of requests (checkpoints); `slots`: the jitted device functions.
"""
from jaxrl_sys.rollout.clock import Clock, ManualClock, WallClock
from jaxrl_sys.rollout.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine import Engine
from jaxrl_sys.rollout.inprocess import InProcessRollout
from jaxrl_sys.rollout.manager import RolloutManager
from jaxrl_sys.rollout.manager_state import ManagerConfig, ManagerStats, RequestFailedError
from jaxrl_sys.rollout.thread_worker import ThreadWorker
from jaxrl_sys.rollout.types import (Completion, FinishReason, Request, RolloutClient, TokenChunk,
                                     request_key)
from jaxrl_sys.rollout.weights import (CorruptWeightsError, MemoryWeightStore, WeightRef,
                                       WeightStore)
from jaxrl_sys.rollout.worker import (Commands, InProcessWorker, Worker, WorkerLost, WorkerReport,
                                      WorkerServer)

__all__ = ["Clock", "Commands", "Completion", "CorruptWeightsError", "Engine", "EngineConfig",
           "EngineStats", "FinishReason", "InProcessRollout", "InProcessWorker", "ManagerConfig",
           "ManagerStats", "ManualClock", "MemoryWeightStore", "Request", "RequestFailedError",
           "RolloutClient", "RolloutManager", "ThreadWorker", "TokenChunk", "WallClock",
           "WeightRef", "WeightStore", "Worker", "WorkerLost", "WorkerReport", "WorkerServer",
           "request_key"]

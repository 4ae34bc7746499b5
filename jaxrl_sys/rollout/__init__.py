"""jaxrl_sys.rollout: records, the generation engine, workers, the rollout manager, weights.

Top level (numpy only): `types` (`Request`, `TokenChunk`, `Completion`, `FinishReason`,
`request_key`, `RolloutClient` / `RolloutSession`: the contract between trainer, manager and
engines), `wire` (exact JSON encoding of requests for checkpoints), `clock` (`Clock`,
`WallClock`, `ManualClock`: time is injected everywhere).

Wings:
- `engine/` (JAX): `Engine(model_config, params, EngineConfig(...), version)`: continuous
  batching over fixed slots, shared-prompt prefill, token streaming, resumable requests, abort,
  weight loads; `slots` (the jitted device functions).
- `workers/`: the plain-data worker protocol (`Commands` in, `WorkerReport` out, `WorkerLost`;
  numpy only), `WorkerServer` / `InProcessWorker` (engine side), `ThreadWorker` (engines of this
  process on threads of their own), Ray actors in `workers.ray` (imports Ray).
- `weights/`: `WeightStore` / `WeightRef` protocols, `MemoryWeightStore`, the tensorstore and
  Ray stores, and `make_weight_store(spec)` (backends looked up by name).
- `manager/` (numpy only): `RolloutManager(workers, store, ManagerConfig(...), clock)`, the
  RolloutClient over workers that come and go (token-level state, routing with version gating,
  migration on loss, continuous load balancing, weight loads); `FleetView`, its read-only
  face for `elastic/` and the simulator.
- `elastic/` (numpy only): `Fleet`, the offload controller, preemption schedules, spot traces.
- `setup/`: where rollout runs (`RolloutSetup`) and `make_client`, which builds every client
  by name (in-process, thread, Ray).

Every name below is imported on first access (module `__getattr__`): importing the package, the
manager or the simulator does not import JAX.
"""
from jaxrl_sys._lazy import lazy_attributes

_NAMES = {
    "Clock": "jaxrl_sys.rollout.clock", "ManualClock": "jaxrl_sys.rollout.clock",
    "WallClock": "jaxrl_sys.rollout.clock",
    "Completion": "jaxrl_sys.rollout.types", "FinishReason": "jaxrl_sys.rollout.types",
    "Request": "jaxrl_sys.rollout.types", "RolloutClient": "jaxrl_sys.rollout.types",
    "RolloutSession": "jaxrl_sys.rollout.types",
    "TokenChunk": "jaxrl_sys.rollout.types", "request_key": "jaxrl_sys.rollout.types",
    "Engine": "jaxrl_sys.rollout.engine", "EngineConfig": "jaxrl_sys.rollout.engine",
    "EngineStats": "jaxrl_sys.rollout.engine",
    "Commands": "jaxrl_sys.rollout.workers", "InProcessWorker": "jaxrl_sys.rollout.workers",
    "ThreadWorker": "jaxrl_sys.rollout.workers", "Worker": "jaxrl_sys.rollout.workers",
    "WorkerLost": "jaxrl_sys.rollout.workers", "WorkerReport": "jaxrl_sys.rollout.workers",
    "WorkerServer": "jaxrl_sys.rollout.workers",
    "CorruptWeightsError": "jaxrl_sys.rollout.weights",
    "MemoryWeightStore": "jaxrl_sys.rollout.weights", "WeightRef": "jaxrl_sys.rollout.weights",
    "WeightStore": "jaxrl_sys.rollout.weights",
    "ManagerConfig": "jaxrl_sys.rollout.manager", "ManagerStats": "jaxrl_sys.rollout.manager",
    "RequestFailedError": "jaxrl_sys.rollout.manager",
    "RolloutStalledError": "jaxrl_sys.rollout.manager",
    "WeightLoadError": "jaxrl_sys.rollout.manager",
    "RolloutManager": "jaxrl_sys.rollout.manager", "FleetView": "jaxrl_sys.rollout.manager",
    "WorkerView": "jaxrl_sys.rollout.manager",
}
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
__all__ = sorted(_NAMES)

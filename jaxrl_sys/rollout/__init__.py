"""jaxrl_sys.rollout: records, the continuous-batching engine and the in-process client.

- `types`: `Request`, `TokenChunk`, `Completion`, `FinishReason`, `request_key`,
  `RolloutClient` (the contract between trainer, manager and engines).
- `Engine(model_config, params, EngineConfig(...), version)`: continuous batching over fixed
  slots, shared-prompt prefill, token streaming, resumable requests, abort, weight swap.
- `InProcessRollout.create(model_config, params, engine_config, version)`: RolloutClient over
  one engine in this process.
- `slots`: the pure jitted prefill / prefix-copy / decode functions.
"""
from jaxrl_sys.rollout.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine import Engine
from jaxrl_sys.rollout.inprocess import InProcessRollout
from jaxrl_sys.rollout.types import (Completion, FinishReason, Request, RolloutClient, TokenChunk,
                                     request_key)

__all__ = ["Completion", "Engine", "EngineConfig", "EngineStats", "FinishReason",
           "InProcessRollout", "Request", "RolloutClient", "TokenChunk", "request_key"]

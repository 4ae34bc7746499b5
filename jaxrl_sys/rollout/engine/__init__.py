"""The generation engine (JAX): `Engine`, its `EngineConfig` / `EngineStats` (`config`), and the
jitted device functions (`slots`), their caller over the slot cache (`device`) and the weights
it runs (`weights`: parameters, MoE state, a LoRA base). A rollout session over engines is built by
`rollout.setup.factory.make_client` (a manager over in-process, thread or Ray workers)."""
from jaxrl_sys.rollout.engine.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine.engine import Engine

__all__ = ["Engine", "EngineConfig", "EngineStats"]

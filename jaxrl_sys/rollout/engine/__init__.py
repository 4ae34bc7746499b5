"""The generation engine (JAX): `Engine`, its `EngineConfig` / `EngineStats` (`config`), and the
jitted device functions (`slots`). A rollout session over engines is built by
`rollout.setup.factory.make_client` (a manager over in-process, thread or Ray workers)."""
from jaxrl_sys.rollout.engine.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine.engine import Engine

__all__ = ["Engine", "EngineConfig", "EngineStats"]

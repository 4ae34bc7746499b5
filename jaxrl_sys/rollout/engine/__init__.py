"""The generation engine (JAX): `Engine`, its `EngineConfig` / `EngineStats` (`config`), the
jitted device functions (`slots`), and `InProcessRollout` (one engine as a RolloutClient)."""
from jaxrl_sys.rollout.engine.config import EngineConfig, EngineStats
from jaxrl_sys.rollout.engine.engine import Engine
from jaxrl_sys.rollout.engine.inprocess import InProcessRollout

__all__ = ["Engine", "EngineConfig", "EngineStats", "InProcessRollout"]

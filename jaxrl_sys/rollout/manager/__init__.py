"""The rollout manager (numpy only): `RolloutManager` (the exchange loop, `exchange`) holding
the state machine (`core.ManagerCore`), its records (`state`), its settings and errors
(`config`) and the routing / balancing rules (`balance`)."""
from jaxrl_sys.rollout.manager.config import (ManagerConfig, RequestFailedError,
                                              RolloutStalledError, WeightPullError)
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.manager.state import ManagerStats

__all__ = ["ManagerConfig", "ManagerStats", "RequestFailedError", "RolloutManager",
           "RolloutStalledError", "WeightPullError"]

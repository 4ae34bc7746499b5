"""The rollout manager: `RolloutManager` (the exchange loop, `exchange`) holding the state
machine (`core`), its records and configuration (`state`), and routing / balancing rules
(`balance`)."""
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.manager.state import ManagerConfig, ManagerStats, RequestFailedError

__all__ = ["ManagerConfig", "ManagerStats", "RequestFailedError", "RolloutManager"]

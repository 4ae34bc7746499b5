"""The rollout manager (numpy only): `RolloutManager` (the exchange loop, `exchange`) driving
the state machine (`core.ManagerCore`: events in, commands and effects out) over its request
table (`requests`) and worker table (`fleet`); its read-only face outside `manager/`
(`view.FleetView`, `view.WorkerView`, `view.ElasticPort`), its records (`state`), its settings
and errors (`config`) and the routing / balancing rules (`balance`)."""
from jaxrl_sys.rollout.manager.config import (ManagerConfig, RequestFailedError,
                                              RolloutStalledError, WeightLoadError)
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.manager.state import ManagerStats
from jaxrl_sys.rollout.manager.view import ElasticPort, FleetView, WorkerView

__all__ = ["ElasticPort", "FleetView", "ManagerConfig", "ManagerStats", "RequestFailedError",
           "RolloutManager", "RolloutStalledError", "WeightLoadError", "WorkerView"]

"""Workers: the plain-data protocol the manager speaks (`protocol`: `Commands`, `WorkerReport`,
`WorkerLost`, `Worker`; numpy only) and its engine-side implementations, imported on first
access: `WorkerServer` / `InProcessWorker` (`server`), `ThreadWorker` (`thread`), Ray actors
(`ray`, imports Ray)."""
from jaxrl_sys.rollout._lazy import lazy_attributes

_NAMES = {
    "Commands": "jaxrl_sys.rollout.workers.server",
    "Worker": "jaxrl_sys.rollout.workers.server",
    "WorkerLost": "jaxrl_sys.rollout.workers.server",
    "WorkerReport": "jaxrl_sys.rollout.workers.server",
    "InProcessWorker": "jaxrl_sys.rollout.workers.server",
    "WorkerServer": "jaxrl_sys.rollout.workers.server",
    "ThreadWorker": "jaxrl_sys.rollout.workers.thread",
}
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
__all__ = sorted(_NAMES)

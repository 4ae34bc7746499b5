"""Workers: the plain-data protocol the manager speaks (`protocol`: `Commands`, `WorkerReport`,
`WorkerLost`, `Worker`; numpy only) and its engine-side implementations, imported on first
access: `WorkerServer` / `InProcessWorker` (`server`), `ThreadWorker` (`thread`), Ray actors
(`ray`, imports Ray)."""
from jaxrl_sys._lazy import lazy_attributes
from jaxrl_sys.rollout.workers.protocol import Commands, Worker, WorkerLost, WorkerReport

_NAMES = {
    "InProcessWorker": "jaxrl_sys.rollout.workers.server",
    "WorkerServer": "jaxrl_sys.rollout.workers.server",
    "ThreadWorker": "jaxrl_sys.rollout.workers.thread",
}
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
__all__ = ["Commands", "InProcessWorker", "ThreadWorker", "Worker", "WorkerLost", "WorkerReport",
           "WorkerServer"]

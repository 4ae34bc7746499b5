"""The rollout manager's settings (`ManagerConfig`) and the errors its waits end in."""
from __future__ import annotations

import dataclasses


class RequestFailedError(RuntimeError):
  """A request could not be completed: it was rejected by a worker, or the workers serving it
  failed with an error more than `ManagerConfig.max_attempts` times (preemptions do not count)."""


class WeightLoadError(RuntimeError):
  """The newest weight version cannot be loaded by the workers (a corrupt or missing version,
  or weights that do not fit the model); the requests waiting for it cannot run."""


class RolloutStalledError(RuntimeError):
  """A wait of the manager cannot make progress (no weights published, no workers, or nothing
  happened for `ManagerConfig.stall_timeout` seconds); the message names what it waited for."""


@dataclasses.dataclass(frozen=True)
class ManagerConfig:
  """Rollout manager settings.

  Attributes:
    theta: Θ, requests a worker may hold beyond its free decode slots (delayed dispatch).
    heartbeat_timeout: seconds an exchange with a serving worker may take before the worker is
      declared lost and its requests migrate.
    startup_timeout: the same for a worker that has no weights yet (process start, first load,
      compilation).
    max_attempts: the failure budget of a request: worker failures (an error in the worker's
      generation loop) it may survive while held there; one more raises `RequestFailedError`.
      Preemptions (a worker lost, killed, removed or silent past its heartbeat) are not the
      request's fault and never count (`ReqState.preempted` counts them).
    max_load_failures: failed loads of one weight version (over all workers) tolerated; one
      more raises `WeightLoadError` from `poll` while it is the newest version (a corrupt
      version is never served: the workers keep serving their previous version meanwhile).
    load_timeout: seconds a worker may take to load a version it was told to load (the first
      one includes compiling its engine) before the load counts as failed and is sent again.
    stall_timeout: seconds `poll` waits while requests are pending and nothing progresses (no
      token, completion, weight load or worker becoming ready) before raising
      `RolloutStalledError` with the manager's state.
    balance: continuous load balancing (move pending / running requests to idle workers).
    tail_balance: with `balance`, also split the last running requests of a batch over idle
      workers (`balance.tail_moves`); False keeps RLBoost's rule alone.
    plateau_frac: a worker's plateau batch B is the smallest batch reaching this fraction of
      its best measured decode throughput.
    plateau_batch: a fixed B for every worker instead of the measured one (None: measured).
    profile_window: decode calls per worker kept for the throughput profile.
    poll_interval: seconds `poll` waits for workers when a round brought nothing.
    migrate_tokens: a lost worker's requests continue from every token they had (token-level
      migration); False restarts them from the prompt (an ablation, RLBoost's "recompute").
    sticky_sessions: a request whose `meta["session"]` names a session (an episode's turns)
      goes to the worker that finished the session's previous request while that worker has
      room (its engine may reuse the session's KV), like any request otherwise.
    max_sessions: sessions remembered for sticky routing (least recently used dropped).
    trim_siblings: trim each migrated request to the shortest migrated sibling of its group, as
      RLBoost's released retry path does (an ablation: it throws decode work away).
  """
  theta: int = 4
  heartbeat_timeout: float = 30.0
  startup_timeout: float = 300.0
  max_attempts: int = 5
  max_load_failures: int = 3
  load_timeout: float = 1800.0
  stall_timeout: float = 900.0
  balance: bool = True
  tail_balance: bool = True
  plateau_frac: float = 0.9
  plateau_batch: int | None = None
  profile_window: int = 256
  poll_interval: float = 0.005
  migrate_tokens: bool = True
  trim_siblings: bool = False
  sticky_sessions: bool = True
  max_sessions: int = 65536

  def __post_init__(self):
    if self.theta < 0 or self.max_attempts < 0:
      raise ValueError(f"ManagerConfig: theta and max_attempts must be >= 0, got {self.theta}, "
                       f"{self.max_attempts}")
    if not (self.heartbeat_timeout > 0 and self.startup_timeout > 0 and self.load_timeout > 0
            and self.stall_timeout > 0):
      raise ValueError("ManagerConfig: heartbeat_timeout, startup_timeout, load_timeout and "
                       "stall_timeout must be > 0")
    if self.max_sessions < 1:
      raise ValueError(f"ManagerConfig.max_sessions must be >= 1, got {self.max_sessions}")
    if self.max_load_failures < 0:
      raise ValueError(f"ManagerConfig.max_load_failures must be >= 0, got "
                       f"{self.max_load_failures}")
    if not 0 < self.plateau_frac <= 1:
      raise ValueError(f"ManagerConfig.plateau_frac must lie in (0, 1], got {self.plateau_frac}")

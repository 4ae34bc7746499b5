"""Adaptive rollout offload (RLBoost's partial-response seeding): the feedback controller.

Each step the trainer's own devices generate for a window `T_seed` while remote workers pull the
new weights and start; then the trainer's unfinished requests are seeded to remote workers and
the trainer trains on responses as they complete. After every step the controller (Algorithm 1
of RLBoost) moves the window and caps the useful remote workers:

  T_seed <- clip(T_seed + rate * (t_wait_train - t_wait_remote), t_min, t_step)
  N_prem <- (t_remote * n_prem + T_seed * N_resv) / t_train
  M[n]   <- T_seed            when the remote count n did not change during the step
  T_seed <- M[n_next]         when the count changes to one seen before

The window grows when the trainer starved (it waited for responses) and shrinks when remote
workers waited for the trainer. N_prem is the number of remote workers for which rollout alone
fits in the training time; the fleet does not run more (RLBoost's release returns the current
count instead; we compute it). As Algorithm 1 writes it, the cap starts at N_resv: before the
first step is measured the fleet runs at most N_resv remote workers (`cap_starts_at_resv`;
off, the cap starts unbounded and every available worker starts before step 0, this library's
earlier behaviour). The fleet runs at most floor(N_prem) workers ("does not allocate beyond
N_prem", at least one so that remote capacity keeps being measured); `cap_ceil` rounds up
instead (this library's earlier behaviour). Everything here is pure:
`offload_update(state, timings, config)` returns the next state, which is plain data saved in
the trainer's checkpoint.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from jaxrl_sys.rollout.manager.view import ElasticPort


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
  """Controller settings.

  Attributes:
    t_init: the first window, seconds.
    rate: eta, the adaptation rate (RLBoost's release moves by the gap / 3).
    t_min: the smallest window, seconds (RLBoost's release floors it at 5 s).
    n_resv: N_resv, rollout engines on the trainer's devices while seeding.
    memory: reuse the best window seen per remote-worker count (the memory table M).
    cap_workers: compute N_prem and cap the fleet with it.
    cap_starts_at_resv: the cap before the first update is N_resv (Algorithm 1); False = no
      cap until the first step is measured (every available worker starts at once).
    cap_ceil: run up to ceil(N_prem) workers instead of floor(N_prem) (Algorithm 1 allocates
      none beyond N_prem; the ceiling was this library's earlier rounding).
    fixed: a fixed window instead of the controller (0 = offload everything at once,
      math.inf = co-located only, no seeding hand-off); None = adaptive.
  """
  t_init: float = 10.0
  rate: float = 1.0 / 3.0
  t_min: float = 0.0
  n_resv: int = 1
  memory: bool = True
  cap_workers: bool = True
  cap_starts_at_resv: bool = True
  cap_ceil: bool = False
  fixed: float | None = None

  def __post_init__(self):
    if self.t_init < 0 or self.t_min < 0 or not 0 < self.rate <= 1 or self.n_resv < 1:
      raise ValueError(f"OffloadConfig: need t_init, t_min >= 0, 0 < rate <= 1, n_resv >= 1; "
                       f"got {self.t_init}, {self.t_min}, {self.rate}, {self.n_resv}")
    if self.fixed is not None and self.fixed < 0:
      raise ValueError(f"OffloadConfig.fixed must be >= 0 (or None), got {self.fixed}")


@dataclasses.dataclass(frozen=True)
class StepTimings:
  """What one step measured (seconds).

  Attributes:
    t_wait_train: the trainer idle after seeding, waiting for responses.
    t_wait_remote: remote workers idle after their last response until the step ended
      (mean over the remote workers alive at the step's end; one preempted or retired during
      the step did not wait for it).
    t_train: the trainer's effective (non-idle) training time.
    t_remote: remote compute time (mean busy time per remote worker).
    n_prem: remote workers, time-averaged over the step.
    n_next: remote workers alive at the end of the step (the count for the next one).
    count_changed: whether a remote worker joined, was lost or was retired during the step.
    t_step: the step's wall time (the window never exceeds it).
  """
  t_wait_train: float
  t_wait_remote: float
  t_train: float
  t_remote: float
  n_prem: float
  n_next: int
  count_changed: bool
  t_step: float


@dataclasses.dataclass(frozen=True)
class OffloadState:
  """The controller's state: the window, the cap, the memory table (count -> window)."""
  t_seed: float
  n_prem_cap: float = math.inf
  memory: tuple[tuple[int, float], ...] = ()
  steps: int = 0

  def to_json(self) -> dict[str, Any]:
    return {"t_seed": self.t_seed, "n_prem_cap": None if math.isinf(self.n_prem_cap)
            else self.n_prem_cap, "memory": [list(kv) for kv in self.memory],
            "steps": self.steps}

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "OffloadState":
    cap = d.get("n_prem_cap")
    return cls(float(d["t_seed"]), math.inf if cap is None else float(cap),
               tuple((int(k), float(v)) for k, v in d.get("memory", ())), int(d.get("steps", 0)))

  def worker_cap(self, ceil: bool = False) -> int | None:
    """The fleet cap: floor(N_prem) (`ceil`: rounded up), at least 1 so that remote capacity
    keeps being measured; None = no cap."""
    if math.isinf(self.n_prem_cap):
      return None
    n = math.ceil(self.n_prem_cap - 1e-9) if ceil else math.floor(self.n_prem_cap + 1e-9)
    return max(1, int(n))


def offload_init(config: OffloadConfig) -> OffloadState:
  """The state before the first step: the first window, and the cap N_prem = N_resv when the
  controller caps the fleet and `cap_starts_at_resv` (Algorithm 1), else no cap."""
  t_seed = config.fixed if config.fixed is not None else config.t_init
  capped = config.cap_workers and config.cap_starts_at_resv and config.fixed is None
  return OffloadState(t_seed, float(config.n_resv) if capped else math.inf)


def offload_update(state: OffloadState, t: StepTimings, config: OffloadConfig) -> OffloadState:
  """One step of Algorithm 1 (see the module docstring); pure."""
  if config.fixed is not None:
    return dataclasses.replace(state, t_seed=config.fixed, steps=state.steps + 1)
  t_seed = state.t_seed + config.rate * (t.t_wait_train - t.t_wait_remote)
  t_seed = min(max(t_seed, config.t_min, 0.0), max(t.t_step, config.t_min))
  cap = state.n_prem_cap if config.cap_workers else math.inf
  if config.cap_workers and t.t_train > 0:
    cap = (t.t_remote * t.n_prem + t_seed * config.n_resv) / t.t_train
  memory = dict(state.memory)
  if config.memory:
    if not t.count_changed:
      memory[int(round(t.n_prem))] = t_seed
    if t.n_next != int(round(t.n_prem)) and t.n_next in memory:
      t_seed = memory[t.n_next]
  return OffloadState(t_seed, cap, tuple(sorted(memory.items())), state.steps + 1)


class OffloadDriver:
  """Runs the seeding window of each step over a `RolloutManager` and feeds the controller.

  Shared by the trainer's loop and the simulator. Per step: `begin_step(manager)` (local
  workers accept work; the fleet cap becomes N_prem), then the caller polls until
  `deadline()` while the trainer's devices generate, `hand_off(manager)` (local workers stop
  taking work and their unfinished requests are seeded to remote workers: aborted with every
  token kept, re-queued, one prefill elsewhere), the caller trains on responses as they
  complete, and `end_step(manager, t_wait_train, t_train)` measures the step and updates the
  controller. Seeding happens only when both local and remote workers exist: with no remote
  worker the step is plain co-located rollout. As a tick hook (`manager.add_tick_hook(driver)`)
  it gives the work back to the local workers if every remote worker is gone mid-step.
  """

  def __init__(self, config: OffloadConfig, state: OffloadState | None = None):
    self.config = config
    self.state = state if state is not None else offload_init(config)
    self.seeding = self.handed_off = False
    self._t0 = 0.0
    self._start: dict[str, Any] = {}

  @staticmethod
  def _split(manager: ElasticPort) -> tuple[list[str], list[str]]:
    local = [w for w, ws in manager.fleet.items() if ws.local]
    return local, [w for w in manager.fleet if w not in local]

  def apply_cap(self, manager: ElasticPort) -> None:
    """Sets the fleet cap (`manager.set_cap`) to the controller's N_prem (when capping); call
    it before the fleet first starts workers so that none beyond the cap start."""
    if self.config.cap_workers:
      manager.set_cap(self.state.worker_cap(self.config.cap_ceil))

  def begin_step(self, manager: ElasticPort) -> None:
    local, remote = self._split(manager)
    for w in local:
      manager.set_accepting(w, True)
    self.seeding, self.handed_off = bool(local and remote), False
    self.apply_cap(manager)
    self._t0 = manager.clock.now()
    stats = manager.fleet.stats
    self._start = dict(times=manager.worker_times(), remote_s=manager.remote_worker_seconds(),
                       counts=(stats.joined, stats.lost), remote=set(remote),
                       tokens=(stats.tokens, stats.tokens_local))

  def deadline(self) -> float | None:
    """Clock time at which the local workers hand off (None: no seeding this step)."""
    return self._t0 + self.state.t_seed if self.seeding and not self.handed_off else None

  def hand_off(self, manager: ElasticPort) -> int:
    """Stops the local workers and seeds their unfinished requests to remote workers."""
    local, remote = self._split(manager)
    self.handed_off = True
    if not remote:
      return 0
    n = 0
    for w in local:
      manager.set_accepting(w, False)
      n += manager.evacuate(w)
    return n

  def __call__(self, manager: ElasticPort, now: float) -> None:  # pylint: disable=unused-argument
    if self.handed_off:
      local, remote = self._split(manager)
      if local and not remote:  # every remote worker is gone: the trainer takes the work back
        for w in local:
          manager.set_accepting(w, True)

  def end_step(self, manager: ElasticPort, t_wait_train: float,
               t_train: float) -> dict[str, float]:
    """Measures the step, updates the controller (when remote workers took part) and returns
    the step's offload metrics."""
    now = manager.clock.now()
    t_step = max(now - self._t0, 1e-9)
    before, after = self._start["times"], manager.worker_times()
    busy, waits = [], []
    for wid, (b, last, local) in after.items():
      if local:
        continue
      b0 = before.get(wid, (0.0, self._t0, False))[0]
      if b - b0 > 0 or wid in manager.fleet:
        busy.append(b - b0)
        if wid in manager.fleet:  # one preempted or retired mid-step did not wait to the end
          waits.append(now - max(last, self._t0))
    n_prem = (manager.remote_worker_seconds() - self._start["remote_s"]) / t_step
    stats = manager.fleet.stats
    _, remote = self._split(manager)
    # "the instance count did not change during the step": no join, no loss, no retirement
    changed = ((stats.joined, stats.lost) != self._start["counts"]
               or set(remote) != self._start["remote"])
    tok0, loc0 = self._start["tokens"]
    tokens, local_tokens = stats.tokens - tok0, stats.tokens_local - loc0
    timings = StepTimings(
        t_wait_train=t_wait_train, t_wait_remote=sum(waits) / len(waits) if waits else 0.0,
        t_train=t_train, t_remote=sum(busy) / len(busy) if busy else 0.0, n_prem=n_prem,
        n_next=len(remote), count_changed=changed, t_step=t_step)
    used = self.state.t_seed if self.seeding else 0.0
    if n_prem > 0 or busy:
      self.state = offload_update(self.state, timings, self.config)
    cap = self.state.worker_cap(self.config.cap_ceil)
    return {"t_seed": used, "t_seed_next": self.state.t_seed, "seeded": float(self.seeding),
            "t_wait_train": t_wait_train, "t_wait_remote": timings.t_wait_remote,
            "t_remote": timings.t_remote, "workers_used": n_prem,
            "n_prem_cap": -1.0 if cap is None else float(cap),
            "n_prem": -1.0 if math.isinf(self.state.n_prem_cap) else self.state.n_prem_cap,
            "tokens_local": float(local_tokens), "tokens_remote": float(tokens - local_tokens)}

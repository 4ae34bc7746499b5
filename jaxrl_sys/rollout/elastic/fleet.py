"""The fleet: which remote workers run, following spot availability, within a cap.

`Fleet` is a manager tick hook (`RolloutManager.add_tick_hook`). Availability comes from a
schedule with `due(now) -> [TraceEvent]` (`schedules.TracePlayer` over a Bamboo / Parcae trace,
`schedules.ChaosSchedule` for random kills and restarts) or is static. Each tick it

1. applies due events: an `add` makes a node available; a `remove` preempts the worker on that
   node (a hard kill, like a spot reclaim: the manager then sees it lost and migrates);
2. forgets workers the manager lost on its own (a crash, a missed heartbeat);
3. starts workers on available, unused nodes up to `min(cap, available)` (as RLBoost's
   replayer: a lost node is replaced at once if spare capacity exists), and retires the newest
   ones gracefully when the cap drops. The cap is the smaller of its own and the manager's
   (`fleet.cap`, set by the offload controller's `set_cap`: N_prem).

Workers come from a `factory(worker_id) -> Worker` (a Ray actor, a simulated instance), so
the same fleet logic runs in real runs, tests and the simulator.

Progress guarantee for random kills (`pause_kills`): a kill that comes due before, since the
previous kill, a worker has finished starting (loaded its first weights) and the rollout has
received a new token is skipped, with one line saying kills are paused; they resume once both
happened. Kills faster than a worker starts, or faster than a worker streams its next tokens
(a slow worker holding many requests), would otherwise leave the fleet restarting forever and
the step never finishing; with the guarantee, each kill costs at most one start-up and one
decode round, and the generated tokens are kept across migrations. With a
`message` callback every kill, start, join (first weights loaded), loss and migration of
requests off a lost worker is one line.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from jaxrl_sys.rollout.elastic.traces import ADD, REMOVE
from jaxrl_sys.rollout.workers.protocol import Worker

if TYPE_CHECKING:
  from jaxrl_sys.rollout.manager.state import ManagerStats
  from jaxrl_sys.rollout.manager.view import ElasticPort, FleetView


def _preempt(worker: Worker) -> None:
  fn = getattr(worker, "preempt", None)
  (fn or worker.kill)()


class Fleet:
  """Starts, preempts and retires workers (see the module docstring).

  Args:
    factory: `factory(worker_id) -> Worker`; the new worker is added to the manager.
    schedule: availability events (`due(now)`), or None for `size` nodes always available.
    size: nodes available without a schedule.
    cap: the most workers to run (an int, or a callable read every tick: N_prem); None = none.
    prefix: worker ids are `f"{prefix}{node}.{n}"` (n counts starts on that node).
    preempt: how a `remove` kills a worker (default: its `preempt()`, else `kill()`).
    retire_after: seconds the fleet must stay above its cap before the newest workers are
      retired (a cap computed per step is noisy; starting a worker costs a start-up delay).
    serving_clock: the schedule's clock stands still while the fleet has workers and none of
      them serves (holds weights and requests to generate): it runs while one serves, and
      while no worker is alive (so that killed slots restart). For random kills
      (`ChaosSchedule`): kill gaps are measured in serving time, so kills land on work in
      progress (a migration to test), a cold start (process, imports, the first compile) is
      never the only target, and however slowly workers start on a loaded host, a worker
      serves for at least one gap between two kills: kills slow the run down but cannot stop
      it. A spot trace keeps False: it replays availability in real time from the first tick.
    pause_kills: skip a `remove` until a worker has finished starting and a new token arrived
      since the previous one (the progress guarantee of random kills; see the module
      docstring).
    message: prints one line per kill, start, join, loss and migration (None: silent, as in
      the simulator).
  """

  def __init__(self, factory: Callable[[str], Worker], *, schedule=None, size: int = 0,
               cap: int | Callable[[], int | None] | None = None, prefix: str = "spot-",
               preempt: Callable[[Worker], None] = _preempt, retire_after: float = 30.0,
               serving_clock: bool = False, pause_kills: bool = False,
               message: Callable[[str], None] | None = None):
    if schedule is None and size <= 0:
      raise ValueError("Fleet needs a schedule or size > 0")
    self.factory, self.schedule, self.prefix, self._preempt = factory, schedule, prefix, preempt
    self._cap = cap
    self.available: set[str] = set() if schedule is not None else {f"n{i}" for i in range(size)}
    self.workers: dict[str, Worker] = {}  # node -> worker
    self.starts: dict[str, int] = {}
    self.log: list[tuple[float, str, str]] = []  # (time, action, worker or node)
    self._origin: float | None = None
    self.retire_after = retire_after
    self._above_since: float | None = None
    self.serving_clock = serving_clock
    self._served = 0.0  # serving time so far (serving_clock)
    self._last: tuple[float, bool] | None = None  # (time, serving) at the previous tick
    self.pause_kills, self._say = pause_kills, message
    self._ready: set[str] = set()  # workers that loaded their first weights
    self._started_since_kill = True
    self._tokens = 0  # the manager's token count, now and at the last kill
    self._tokens_at_kill = -1
    self._paused = False
    self.skipped_kills = 0
    self._migrated = (0, 0)  # the manager's (migrated, tokens_kept) counters last seen

  def cap(self) -> int | None:
    return self._cap() if callable(self._cap) else self._cap

  def _serving(self, manager: ElasticPort) -> bool:
    fleet = manager.fleet
    for w in self.workers.values():
      ws = fleet.get(w.worker_id)
      if ws is not None and ws.version >= 0 and ws.assigned:
        return True
    return False

  def _schedule_time(self, manager: ElasticPort, now: float) -> float:
    if not self.serving_clock:
      if self._origin is None:
        self._origin = now
      return now - self._origin
    if self._last is not None and self._last[1]:
      self._served += now - self._last[0]
    self._last = (now, not self.workers or self._serving(manager))
    return self._served

  def _message(self, text: str) -> None:
    if self._say is not None:
      self._say(text)

  def _joins(self, fleet: FleetView, stats: ManagerStats, now: float) -> None:
    """Notes the workers that loaded their first weights since the previous tick."""
    for w in self.workers.values():
      ws = fleet.get(w.worker_id)
      if ws is not None and ws.version >= 0 and w.worker_id not in self._ready:
        self._ready.add(w.worker_id)
        self.log.append((now, "join", w.worker_id))
        self._started_since_kill = True
        self._message(f"fleet: {w.worker_id} joined (serving weight version {ws.version})")
    self._tokens = stats.tokens
    if self._paused and self._may_kill():
      self._paused = False
      self._message("fleet: kills resumed (a worker finished starting and tokens arrived)")

  def _may_kill(self) -> bool:
    return self._started_since_kill and self._tokens > self._tokens_at_kill

  def _migrations(self, stats: ManagerStats) -> None:
    now = (stats.migrated, stats.tokens_kept)
    moved, kept = now[0] - self._migrated[0], now[1] - self._migrated[1]
    self._migrated = now
    if moved > 0:
      self._message(f"fleet: migrated {moved} request(s) off lost workers ({kept} generated "
                    "token(s) kept, not regenerated)")

  def _remove(self, node: str, now: float) -> None:
    w = self.workers.get(node)
    if self.pause_kills and w is not None and not self._may_kill():
      self.skipped_kills += 1
      self.log.append((now, "kill skipped", node))
      if not self._paused:
        self._paused = True
        self._message("fleet: kills paused: since the last kill no worker has finished "
                      "starting, or no token arrived (kills faster than workers start or stream "
                      "would stop all progress); they resume when both happened")
      return
    self.available.discard(node)
    self.workers.pop(node, None)
    if w is not None:
      self._preempt(w)
      self._started_since_kill = False
      self._tokens_at_kill = self._tokens
      self.log.append((now, "preempt", w.worker_id))
      self._message(f"fleet: killed {w.worker_id}")

  def __call__(self, manager: ElasticPort, now: float) -> None:
    t = self._schedule_time(manager, now)
    fleet = manager.fleet
    # The counters are a copy: read only when kills may pause or lines are printed (the
    # simulator ticks a silent fleet many thousand times).
    stats = fleet.stats if self.pause_kills or self._say is not None else None
    if stats is not None:
      self._joins(fleet, stats, now)
    if self.schedule is not None:
      for ev in self.schedule.due(t):
        if ev.kind == ADD:
          self.available.add(ev.node)
        elif ev.kind == REMOVE:
          self._remove(ev.node, now)
    for node, w in list(self.workers.items()):
      if w.worker_id not in fleet:
        del self.workers[node]
        self.log.append((now, "gone", w.worker_id))
        self._message(f"fleet: {w.worker_id} is gone (lost by the manager)")
    if stats is not None:
      self._migrations(stats)
    cap, wanted = self.cap(), fleet.cap
    if wanted is not None:
      cap = wanted if cap is None else min(cap, wanted)
    want = len(self.available) if cap is None else min(cap, len(self.available))
    for node in sorted(self.available - set(self.workers)):
      if len(self.workers) >= want:
        break
      n = self.starts.get(node, 0)
      self.starts[node] = n + 1
      w = self.factory(f"{self.prefix}{node}.{n}")
      self.workers[node] = w
      manager.add_worker(w)
      self.log.append((now, "start", w.worker_id))
      self._message(f"fleet: starting {w.worker_id}")
    extra = len(self.workers) - want
    if extra <= 0:
      self._above_since = None
      return
    if self._above_since is None:
      self._above_since = now
    if now - self._above_since < self.retire_after:
      return
    self._above_since = None
    for node in list(self.workers)[::-1][:extra]:
      w = self.workers.pop(node)
      if w.worker_id in fleet:
        manager.retire_worker(w.worker_id)
      self.log.append((now, "retire", w.worker_id))

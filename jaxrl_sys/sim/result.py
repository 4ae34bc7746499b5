"""What one simulated run measured: per-step records, throughput, cost, series for plots.

Metrics (RLBoost's, RLBOOST.md 1.7): throughput = response tokens generated and trained in
the completed steps / their wall time; cost = reserved nodes x on-demand price x wall time
(+ reserved rollout instances in the disagg mode) + spot instance-seconds x spot price, an
instance counting from the fleet's request to its preemption or release; cost efficiency =
tokens per dollar. Spot instances, two time averages over the same window (from 0 to the end
of the last completed step): `spot_available`, the trace's live instances, and `spot_used`, the
instances the fleet ran (from their start, start-up included, to their end). Everything is plain
data (`to_json`), rounded so that the same seed gives byte-identical JSON.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxrl_sys.sim.prices import run_cost, tokens_per_dollar


@dataclasses.dataclass(frozen=True)
class StepRecord:
  """One RL step (times in virtual seconds).

  Attributes:
    step: the weight version it trained on.
    start / end / handoff: when it began, ended, and the local engines handed off.
    tokens / prompt_tokens: response / prompt tokens trained.
    t_wait_train / t_train: trainer idle after seeding / training incl. overhead.
    t_seed / t_seed_next: the window used and the controller's next one.
    t_wait_remote / t_remote: remote instances' mean idle time after their last response / mean
      busy time (the controller's inputs).
    last_done: when the step's last response finished.
    workers_used: remote instances, time-averaged; n_prem_cap: the controller's cap (-1: none),
      floor(n_prem); n_prem: the controller's N_prem after the step, unrounded (-1: none).
    remote_live: remote instances alive at the end.
    delta: the manager's counters during the step (migrated, tokens_kept, balanced, lost, ...).
  """
  step: int
  start: float
  end: float
  handoff: float
  tokens: int
  prompt_tokens: int
  t_wait_train: float
  t_train: float
  t_seed: float
  t_seed_next: float
  t_wait_remote: float
  t_remote: float
  last_done: float
  workers_used: float
  n_prem_cap: float
  remote_live: int
  delta: dict
  n_prem: float = -1.0

  @property
  def duration(self) -> float:
    return self.end - self.start


def _r(x: float, nd: int = 6) -> float:
  return float(round(x, nd)) if math.isfinite(x) else x


@dataclasses.dataclass(frozen=True)
class SimResult:
  """Summary of one run (see the module docstring); `series` holds per-minute instance counts."""
  mode: str
  preset: str
  steps: list
  wall: float
  tokens: int
  throughput: float
  cost: float
  cost_per_mtok: float
  tokens_per_dollar: float
  spot_instance_hours: float
  counters: dict
  series: dict
  spot_available: float = 0.0
  spot_used: float = 0.0

  @classmethod
  def build(cls, cfg, trace, steps: list[StepRecord], end: float, cluster, manager,
            simulated: float | None = None) -> SimResult:
    """The result of a run whose completed steps end at `end`; `simulated` (default the
    horizon) is the virtual time the run covered, the span of the per-minute series."""
    p = cfg.preset
    tokens = sum(s.tokens for s in steps)
    spot_s = cluster.instance_seconds(0.0, end)
    nodes = p.train_nodes
    cost = run_cost(cfg.prices, end, nodes, spot_s, p.gpus_per_node, p.gpus_per_instance)
    if cfg.mode == "disagg":
      spot_s = 0.0
      cost = run_cost(cfg.prices, end, nodes, 0.0, p.gpus_per_node, p.gpus_per_instance) + \
          cfg.disagg_instances * p.gpus_per_instance * cfg.prices.on_demand_gpu_hour * end / 3600
    tpd = tokens_per_dollar(tokens, cost) if cost > 0 else 0.0
    span = cfg.horizon if simulated is None else simulated
    grid = [60.0 * i for i in range(int(span // 60) + 1)]
    series = {"t": grid, "used": [cluster.live_remote_at(t) for t in grid]}
    if trace is not None:
      series["available"] = [trace.live_at(t) for t in grid]
    counters = dict(manager.fleet.stats.counters())
    counters.update(stalls=cluster.stalls, retracted=sum(
        w.engine.retracted for w in cluster.workers.values()),
        prefilled=sum(w.engine.prefilled for w in cluster.workers.values()),
        decoded=sum(w.engine.decoded for w in cluster.workers.values()))
    pulls = cluster.pull_seconds
    counters.update(pulls=len(pulls), pull_s_max=max(pulls, default=0.0),
                    pull_failures=sum(1 for e in manager.fleet.events if e[1] == "pull_failed"),
                    pull_s_mean=sum(pulls) / len(pulls) if pulls else 0.0)
    span = sum(s.duration for s in steps)
    used = sum(s.workers_used * s.duration for s in steps) / span if span > 0 else 0.0
    avail = trace.mean_live(0.0, end) if trace is not None and end > 0 else 0.0
    return cls(cfg.mode, p.name, steps, end, tokens, tokens / end if end > 0 else 0.0, cost,
               1e6 / tpd if tpd > 0 else math.inf, tpd, spot_s / 3600, counters, series,
               avail, used)

  def to_json(self) -> dict[str, Any]:
    steps = [{k: (_r(v) if isinstance(v, float) else v)
              for k, v in dataclasses.asdict(s).items()} for s in self.steps]
    return {"mode": self.mode, "preset": self.preset, "wall_s": _r(self.wall),
            "tokens": self.tokens, "throughput": _r(self.throughput, 3),
            "cost": _r(self.cost, 4), "cost_per_mtok": _r(self.cost_per_mtok, 4),
            "tokens_per_dollar": _r(self.tokens_per_dollar, 3),
            "spot_instance_hours": _r(self.spot_instance_hours, 4),
            "spot_available": _r(self.spot_available, 4), "spot_used": _r(self.spot_used, 4),
            "counters": {k: _r(v) if isinstance(v, float) else v
                         for k, v in self.counters.items()},
            "series": self.series, "steps": steps}

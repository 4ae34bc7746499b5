"""Ours for RLBoost's held-out figures: never tuned on, run once the fit is fixed.

- `bamboo_table`: the Bamboo p3 table (RLBOOST.md 1.8): 50% of the instances, 2-hour
  segments, RLBoost vs co-located veRL per preset, means over segments (1.66x / 1.97x / 1.51x
  throughput, +34% / +49% / +28% cost efficiency for 8B / 14B / 32B); the veRL.2x runs ride
  along for the spot-discount figures.
- `break_even`: the spot discount at which RLBoost's tokens per dollar equal co-located veRL's
  on those runs ("from about a 30% discount it beats veRL on cost"), and its cost efficiency at
  no discount ("between veRL and veRL.2x").
- `ablations`: the paper's ablation magnitudes, on scenarios built as the paper describes them
  (Qwen3-14B, one 8xH100, warm 2xH100 instances):
  - `preempt_and_replace_trace`: six instances, five preempted at once, replacements arriving
    one at a time ("5 of 6 instances are preempted and replacements arrive gradually"): no
    seeding costs 19% of RLBoost's throughput, the memory adds 6%; synchronous weight push
    (the paper gives only the direction, Appendix D) loses the replacements that join mid-step;
  - the migration step: a static pool of six, three preempted at once 100 s or 200 s into a
    steady-state step; token-level migration cuts that step's overhead (its time beyond the
    same step undisturbed) against recompute-from-prompt by 33% and 76%.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jaxrl_sys.rollout.elastic.traces import ADD, REMOVE, Trace, TraceEvent, constant_trace
from jaxrl_sys.sim import experiment, points
from jaxrl_sys.sim.driver import SimConfig, Workload, simulate
from jaxrl_sys.sim.fit import FITTED, InstanceFit
from jaxrl_sys.sim.presets import get_preset
from jaxrl_sys.sim.prices import RLBOOST_PRICES, Prices
from jaxrl_sys.sim.settings import SETTINGS, config_for
from jaxrl_sys.sim.startup import WARM_RESTART

LABELS = {"qwen3-8b": "8B", "qwen3-14b": "14B", "qwen3-32b": "32B"}


def bamboo_bases(fit: InstanceFit, segment_hours: float, seed: int = 0,
                 base_kw: dict[str, Any] | None = None) -> dict[str, SimConfig]:
  """{preset: base config} of the held-out table: 8B, 14B, 32B on `fit`, one segment's horizon."""
  return {name: SimConfig(fit.apply(get_preset(name)), workload=Workload(lengths=fit.lengths()),
                          engine=fit.engine(), horizon=segment_hours * 3600.0, seed=seed,
                          **(base_kw or {}))
          for name in LABELS}


def bamboo_table(trace: Trace, fit: InstanceFit = FITTED, segment_hours: float = 2.0,
                 sample: float = 0.5, seed: int = 0, jobs: int = 1,
                 base_kw: dict[str, Any] | None = None, extra: Sequence[str] = (),
                 indices: str = "", on_done=None) -> dict[str, Any]:
  """Ours for every Bamboo figure of `paper.HELD_OUT`: segments of `trace` (sampled like
  RLBoost), RLBoost vs co-located per preset, means over segments. Also returns the
  per-segment `(x, ce, instances used)` under "segments", each `extra` setting's mean
  `(x, ce)` under "settings", and the rows (`experiment.run_grid`) under "rows". `on_done`:
  `experiment.run_grid`'s progress callback."""
  from jaxrl_sys.sim import report  # pylint: disable=import-outside-toplevel
  segment_hours, segs = experiment.plan_segments(trace.sample(sample, seed), segment_hours,
                                                 indices)
  bases = bamboo_bases(fit, segment_hours, seed, base_kw)
  settings = [SETTINGS[n] for n in dict.fromkeys(("colocated", "rlboost", *extra))]
  rows = experiment.run_grid(bases, settings, segs, jobs, on_done=on_done)
  summ = report.summarize(rows, [n for n, _ in segs])
  out: dict[str, Any] = {"segments": {}, "settings": {}, "rows": rows,
                         "segment_names": [n for n, _ in segs]}
  for name, label in LABELS.items():
    rl = summ[name]["rlboost"]
    out[f"bamboo {label} x"] = rl["mean"]["x_throughput"]
    out[f"bamboo {label} ce"] = 1.0 + rl["mean"]["cost_eff"]
    out["segments"][label] = {seg: (v["x_throughput"], 1.0 + v["cost_eff"], v["workers_used"])
                              for seg, v in rl["segments"].items()}
    out["settings"][label] = {n: (summ[name][n]["mean"]["x_throughput"],
                                  1.0 + summ[name][n]["mean"]["cost_eff"]) for n in extra}
  return out


def _tokens_per_dollar(result: dict[str, Any], nodes: int, prices: Prices,
                       gpus_per_node: int = 8, gpus_per_instance: int = 2) -> float:
  hours = result["wall_s"] / 3600.0
  cost = (hours * nodes * gpus_per_node * prices.on_demand_gpu_hour
          + result["spot_instance_hours"] * gpus_per_instance * prices.spot_gpu_hour)
  return result["tokens"] / cost


def cost_efficiency_at(rows: Sequence[dict], preset: str, discount: float,
                       prices: Prices = RLBOOST_PRICES) -> float:
  """RLBoost's tokens per dollar relative to co-located veRL's, mean over the segments of
  `rows` (`experiment.run_grid`), with spot at `discount` off the on-demand price."""
  p = get_preset(preset)
  at = prices.with_discount(discount)
  co = next(r["result"] for r in rows if r["preset"] == preset and r["setting"] == "colocated")
  co_tpd = _tokens_per_dollar(co, p.train_nodes, at)
  ratios = [_tokens_per_dollar(r["result"], p.train_nodes, at) / co_tpd for r in rows
            if r["preset"] == preset and r["setting"] == "rlboost"]
  return sum(ratios) / len(ratios)


def break_even(rows: Sequence[dict], preset: str, prices: Prices = RLBOOST_PRICES) -> float:
  """The spot discount (0..1) at which RLBoost's mean cost efficiency equals co-located
  veRL's on `rows` (it rises with the discount); 0 when RLBoost is cheaper at no discount,
  1 when it never is."""
  lo, hi = 0.0, 1.0
  if cost_efficiency_at(rows, preset, lo, prices) >= 1.0:
    return 0.0
  if cost_efficiency_at(rows, preset, hi, prices) < 1.0:
    return 1.0
  for _ in range(50):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if cost_efficiency_at(rows, preset, mid, prices) < 1.0 else (lo, mid)
  return 0.5 * (lo + hi)


def preempt_and_replace_trace(n: int = 6, lost: int = 5, at: float = 1200.0,
                              every: float = 600.0, duration: float = 7200.0) -> Trace:
  """`n` instances from 0; `lost` of them preempted at `at` s; one replacement every `every` s
  from `at + every` on."""
  ev = [TraceEvent(0.0, ADD, f"node-{i}") for i in range(n)]
  ev += [TraceEvent(at, REMOVE, f"node-{i}") for i in range(lost)]
  ev += [TraceEvent(at + (i + 1) * every, ADD, f"new-{i}") for i in range(lost)]
  return Trace(tuple(ev), duration, f"{n}-{lost}@{at:g}+1/{every:g}s")


def scenario_base(fit: InstanceFit, duration: float = 7200.0, seed: int = 0) -> SimConfig:
  """The ablations' runs: Qwen3-14B on one 8xH100, warm instances (the paper replays its
  scenarios on machines it holds), Algorithm 1 as RLBoost runs it."""
  return SimConfig(fit.apply(get_preset("qwen3-14b")), workload=Workload(lengths=fit.lengths()),
                   engine=fit.engine(), startup=WARM_RESTART, horizon=duration, seed=seed)


def _throughput(args) -> float:
  cfg, trace = args
  return simulate(cfg, trace).throughput


def _step_times(args) -> list[float]:
  cfg, trace = args
  return [s.end - s.start for s in simulate(cfg, trace).steps]


def _step_starts(cfg: SimConfig, trace: Trace) -> list[float]:
  return [s.start for s in simulate(cfg, trace).steps]


def ablations(fit: InstanceFit = FITTED, jobs: int = 1, seed: int = 0,
              step: int = 3) -> dict[str, float]:
  """Ours for the ablation figures of `paper.HELD_OUT` (see the module docstring): throughput
  ratios on the preempt-and-replace scenario, and the migration step's overhead cut at 100 s
  and 200 s (`step` = the steady-state step the three preemptions hit)."""
  base = scenario_base(fit, seed=seed)
  trace = preempt_and_replace_trace()
  names = ("rlboost", "no_seeding", "no_memory", "sync_push")
  thr = dict(zip(names, experiment.parallel_map(
      _throughput, [(config_for(SETTINGS[n], base), trace) for n in names], jobs)))
  # The migration step: a static pool of six (every instance used, as the static-pool runs).
  pool = dataclasses.replace(points.pool_config(fit, steps=step + 1), seed=seed)
  starts = _step_starts(pool, constant_trace(6, 1e9))
  work, keys = [(pool, constant_trace(6, 1e9))], []
  for after in (100.0, 200.0):
    t = starts[step] + after
    hit = Trace(tuple(TraceEvent(0.0, ADD, f"node-{i}") for i in range(6))
                + tuple(TraceEvent(t, REMOVE, f"node-{i}") for i in range(3)), 1e9,
                f"6-3@{t:g}")
    for name in ("rlboost", "restart"):
      keys.append((after, name))
      work.append((config_for(SETTINGS[name], pool), hit))
  times = experiment.parallel_map(_step_times, work, jobs)
  undisturbed = times[0][step]
  over = {k: t[step] - undisturbed for k, t in zip(keys, times[1:])}
  out = {"no seeding x": thr["no_seeding"] / thr["rlboost"],
         "memory x": thr["rlboost"] / thr["no_memory"],
         "sync push x": thr["sync_push"] / thr["rlboost"]}
  for after in (100.0, 200.0):
    out[f"migration cut at {after:g} s"] = 1.0 - over[(after, "rlboost")] / over[(after,
                                                                                  "restart")]
    out[f"restart overhead at {after:g} s"] = over[(after, "restart")]
  return out

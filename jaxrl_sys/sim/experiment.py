"""Grids of simulated runs: presets x settings x trace segments, run in parallel processes.

`segments(trace, hours)` cuts a (sampled) trace into whole segments; `size_disagg` picks the
reserved rollout pool of the Disagg.BAL baseline; `run_grid` runs every (preset, setting,
segment) job - settings that do not use the trace (co-located, disaggregated) run once per
preset and stand for every segment - and returns plain-data rows, in a fixed order, so that
the same arguments give the same output whatever the process count.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import multiprocessing
from typing import Any, Callable, Sequence

from jaxrl_sys.rollout.elastic.traces import Trace
from jaxrl_sys.sim.driver import SimConfig, simulate
from jaxrl_sys.sim.settings import SETTINGS, Setting, config_for

DISAGG_CANDIDATES = (1, 2, 3, 4, 6, 8, 10, 12, 16)


def segments(trace: Trace, hours: float) -> list[tuple[str, Trace]]:
  """The whole `hours`-long segments of `trace`, named by their window ("0-2h", ...)."""
  span = hours * 3600.0
  n = int((trace.end + 1e-9) // span)
  out = []
  for i in range(n):
    a, b = i * span, (i + 1) * span
    out.append((f"{a / 3600:g}-{b / 3600:g}h", trace.segment(a, b, f"{trace.name}[{i}]")))
  return out


def plan_segments(trace: Trace, hours: float,
                  indices: str = "") -> tuple[float, list[tuple[str, Trace]]]:
  """`(hours, segments)` to run: the whole `hours`-long segments of `trace`, or, when the trace
  is shorter than one, the whole trace as a single segment of its own length (`hours` then
  says how long); `indices` ("0,2", "" = all) picks some. Raises ValueError naming the
  problem (a trace of no duration, an index that is not a segment)."""
  if not hours > 0:
    raise ValueError(f"segment length must be > 0 hours, got {hours}")
  if not trace.end > 0:
    raise ValueError(f"trace {trace.name!r} spans 0 s: nothing to replay")
  if trace.end < hours * 3600.0 - 1e-9:
    hours = trace.end / 3600.0
  segs = segments(trace, hours)
  if indices.strip():
    try:
      idx = [int(i) for i in indices.split(",")]
    except ValueError:
      raise ValueError(f"segments {indices!r}: expected a comma list of integers") from None
    bad = [i for i in idx if not 0 <= i < len(segs)]
    if bad:
      raise ValueError(f"no segment {bad}: the trace has {len(segs)} segment(s) of {hours:.3g} h "
                       f"(0..{len(segs) - 1}: {', '.join(n for n, _ in segs)})")
    segs = [segs[i] for i in idx]
  return hours, segs


def _throughput(cfg: SimConfig) -> float:
  return simulate(cfg).throughput


def size_disagg(bases: dict[str, SimConfig], candidates: Sequence[int] = DISAGG_CANDIDATES,
                steps: int = 2, within: float = 0.95,
                jobs: int = 1) -> tuple[dict[str, int], dict[str, dict[int, float]]]:
  """Disagg.BAL's pool per preset: the fewest reserved rollout instances whose throughput (over
  `steps` steps) is within `within` of the best candidate's - the point where rollout keeps
  pace with training (StreamRL's resource optimizer balances the two stages). Returns
  `({preset: n}, {preset: {n: tok/s}})`."""
  keys = [(name, n) for name in bases for n in candidates]
  cfgs = [dataclasses.replace(config_for(SETTINGS["disagg"], bases[name], n), max_steps=steps,
                              horizon=1e9) for name, n in keys]
  thr: dict[str, dict[int, float]] = {name: {} for name in bases}
  for (name, n), t in zip(keys, parallel_map(_throughput, cfgs, jobs)):
    thr[name][n] = t
  best = {name: min(n for n, t in v.items() if t >= within * max(v.values()))
          for name, v in thr.items()}
  return best, thr


def parallel_map(fn, items: list, jobs: int) -> list:
  """`[fn(x) for x in items]`, over `jobs` forked processes when jobs > 1 (order kept)."""
  if jobs <= 1:
    return [fn(x) for x in items]
  ctx = multiprocessing.get_context("fork")
  with cf.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
    return list(pool.map(fn, items))


@dataclasses.dataclass(frozen=True)
class Job:
  """One run: `setting` of `base` over segment `segment` (None for trace-free settings)."""
  preset: str
  setting: Setting
  segment: str | None
  config: SimConfig
  trace: Trace | None


def _run(job: Job, timer: Callable[[], float] | None = None) -> dict[str, Any]:
  t0 = timer() if timer else 0.0
  res = simulate(job.config, job.trace)
  return {"preset": job.preset, "setting": job.setting.name, "segment": job.segment,
          "sim_seconds": timer() - t0 if timer else 0.0, "result": res.to_json()}


def run_grid(bases: dict[str, SimConfig], settings: Sequence[Setting],
             segs: Sequence[tuple[str, Trace]], jobs: int = 1,
             disagg: dict[str, int] | None = None,
             timer: Callable[[], float] | None = None) -> list[dict[str, Any]]:
  """Runs every job; rows in (preset, setting, segment) order. `bases` maps a preset name to its
  base config (horizon = the segment length); `disagg` the pool size per preset. `timer` (a host
  clock, e.g. `time.perf_counter`, injected by the caller) measures each run's own cost as
  `sim_seconds` (0 without one); simulated time never comes from it."""
  work = []
  for name, base in bases.items():
    for s in settings:
      if s.uses_trace:
        for seg, tr in segs:
          work.append(Job(name, s, seg, config_for(s, base), tr))
      else:
        n = (disagg or {}).get(name, 0)
        work.append(Job(name, s, None, config_for(s, base, n), None))
  return parallel_map(functools.partial(_run, timer=timer), work, jobs)

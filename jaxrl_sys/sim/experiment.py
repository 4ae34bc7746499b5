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
import math
import multiprocessing
import traceback
from typing import Any, Callable, Sequence

from jaxrl_sys.rollout.elastic.traces import Trace
from jaxrl_sys.sim.driver import SimConfig, simulate
from jaxrl_sys.sim.settings import SETTINGS, Setting, config_for

DISAGG_CANDIDATES = (1, 2, 3, 4, 6, 8, 10, 12, 16)


# A run of "every segment" covers at most this many (a trace whose times are in the wrong unit,
# or `--trace_time_scale=1e12`, would otherwise ask for billions); `indices` picks any of them.
MAX_SEGMENTS = 1000
# The longest segment one run simulates (hours): about six RL steps an hour, so a week is ~1,000
# steps of a few CPU seconds each.
MAX_SEGMENT_HOURS = 168.0
# The most spot instances one run may have available at once. A run's cost grows with the square
# of its fleet (200 uncapped Qwen3-14B instances: ~25 s of CPU per step), and one training
# node's link feeds four pulls at a time (`sim.senders`): 256 instances wait ~5 min for their
# weights each step. A busier trace runs with a fraction of its instances (`Trace.sample`).
MAX_FLEET = 256


def _segment_count(trace: Trace, hours: float) -> int:
  return int((trace.end + 1e-9) // (hours * 3600.0))


def _segment(trace: Trace, hours: float, i: int) -> tuple[str, Trace]:
  a, b = i * hours * 3600.0, (i + 1) * hours * 3600.0
  return f"{a / 3600:g}-{b / 3600:g}h", trace.segment(a, b, f"{trace.name}[{i}]")


def segments(trace: Trace, hours: float) -> list[tuple[str, Trace]]:
  """The whole `hours`-long segments of `trace`, named by their window ("0-2h", ...)."""
  return [_segment(trace, hours, i) for i in range(_segment_count(trace, hours))]


def plan_segments(trace: Trace, hours: float,
                  indices: str = "") -> tuple[float, list[tuple[str, Trace]]]:
  """`(hours, segments)` to run: the whole `hours`-long segments of `trace`, or, when the trace
  is shorter than one, the whole trace as a single segment of its own length (`hours` then
  says how long); `indices` ("0,2", "" = all) picks some. Raises ValueError naming the
  problem (a trace of no duration, an index that is not a segment)."""
  if not (hours > 0 and math.isfinite(hours)):
    raise ValueError(f"segment length must be a number of hours > 0, got {hours}")
  if hours > MAX_SEGMENT_HOURS:
    raise ValueError(f"segments of {hours:g} h are longer than the {MAX_SEGMENT_HOURS:g} h one "
                     "run simulates; use shorter segments (--segment_hours)")
  if not trace.end > 0:
    raise ValueError(f"trace {trace.name!r} spans 0 s: nothing to replay")
  if trace.max_live() > MAX_FLEET:
    keep = MAX_FLEET / trace.max_live()
    raise ValueError(f"trace {trace.name!r} makes up to {trace.max_live():,} spot instances "
                     f"available at once; the simulator runs at most {MAX_FLEET} (its cost grows "
                     "with the square of the fleet, and a training node's link feeds four pulls "
                     f"at a time): keep a fraction of them with --sample (e.g. {keep:.2g})")
  if trace.end < hours * 3600.0 - 1e-9:
    hours = trace.end / 3600.0
  n = _segment_count(trace, hours)
  names = lambda: ", ".join(_segment(trace, hours, i)[0] for i in range(min(n, 8))) + \
      (", ..." if n > 8 else "")  # noqa: E731
  if not indices.strip():
    if n > MAX_SEGMENTS:
      raise ValueError(f"trace {trace.name!r} spans {trace.end / 3600:,.4g} h: {n:,} segments of "
                       f"{hours:g} h, more than the {MAX_SEGMENTS} one run covers (are its times "
                       "in the unit its format says, and --trace_time_scale right?); pick some "
                       "with --segments, or lengthen --segment_hours")
    return hours, segments(trace, hours)
  try:
    idx = [int(i) for i in indices.split(",")]
  except ValueError:
    raise ValueError(f"segments {indices!r}: expected a comma list of integers") from None
  bad = [i for i in idx if not 0 <= i < n]
  if bad:
    raise ValueError(f"no segment {bad}: the trace has {n} segment(s) of {hours:.3g} h "
                     f"(0..{n - 1}: {names()})" if n else
                     f"no segment {bad}: the trace has no whole segment of {hours:.3g} h")
  return hours, [_segment(trace, hours, i) for i in idx]


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


def parallel_map(fn, items: list, jobs: int,
                 on_done: Callable[[int, Any], None] | None = None) -> list:
  """`[fn(x) for x in items]`, over `jobs` forked processes when jobs > 1 (order kept).
  `on_done(i, result)` is called in this process as each item finishes (in completion order)."""
  if jobs <= 1:
    out = []
    for i, x in enumerate(items):
      out.append(fn(x))
      if on_done is not None:
        on_done(i, out[-1])
    return out
  ctx = multiprocessing.get_context("fork")
  out: list = [None] * len(items)
  with cf.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
    futures = {pool.submit(fn, x): i for i, x in enumerate(items)}
    try:
      for fut in cf.as_completed(futures):
        i = futures[fut]
        out[i] = fut.result()
        if on_done is not None:
          on_done(i, out[i])
    except BaseException:
      for fut in futures:
        fut.cancel()
      raise
  return out


@dataclasses.dataclass(frozen=True)
class Job:
  """One run: `setting` of `base` over segment `segment` (None for trace-free settings)."""
  preset: str
  setting: Setting
  segment: str | None
  config: SimConfig
  trace: Trace | None

  @property
  def label(self) -> str:
    """`preset setting segment` (the segment left out for trace-free settings)."""
    return " ".join(x for x in (self.preset, self.setting.name, self.segment) if x)


class RunError(RuntimeError):
  """A simulated run failed: names the run (preset, setting, segment) and the error."""


def _run(job: Job, timer: Callable[[], float] | None = None) -> dict[str, Any]:
  t0 = timer() if timer else 0.0
  row = {"preset": job.preset, "setting": job.setting.name, "segment": job.segment}
  try:
    res = simulate(job.config, job.trace)
  except Exception as err:  # pylint: disable=broad-except
    # Returned, not raised: the caller names the run and keeps every other one.
    return {**row, "sim_seconds": timer() - t0 if timer else 0.0,
            "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
  return {**row, "sim_seconds": timer() - t0 if timer else 0.0, "result": res.to_json()}


def grid_jobs(bases: dict[str, SimConfig], settings: Sequence[Setting],
              segs: Sequence[tuple[str, Trace]],
              disagg: dict[str, int] | None = None) -> list[Job]:
  """The runs of a grid, in (preset, setting, segment) order (see `run_grid`)."""
  work = []
  for name, base in bases.items():
    for s in settings:
      if s.uses_trace:
        for seg, tr in segs:
          work.append(Job(name, s, seg, config_for(s, base), tr))
      else:
        n = (disagg or {}).get(name, 0)
        work.append(Job(name, s, None, config_for(s, base, n), None))
  return work


def run_grid(bases: dict[str, SimConfig], settings: Sequence[Setting],
             segs: Sequence[tuple[str, Trace]], jobs: int = 1,
             disagg: dict[str, int] | None = None,
             timer: Callable[[], float] | None = None,
             on_done: Callable[[Job, dict[str, Any]], None] | None = None,
             keep_going: bool = False) -> list[dict[str, Any]]:
  """Runs every job; rows in (preset, setting, segment) order. `bases` maps a preset name to its
  base config (horizon = the segment length); `disagg` the pool size per preset. `timer` (a host
  clock, e.g. `time.perf_counter`, injected by the caller) measures each run's own cost as
  `sim_seconds` (0 without one); simulated time never comes from it. `on_done(job, row)` sees
  each row as its run finishes. A run that raises gives a row with `error` (type and message)
  and `traceback` instead of `result`; unless `keep_going`, the first one then raises
  `RunError` naming the run, after the runs under way have finished."""
  work = grid_jobs(bases, settings, segs, disagg)
  cb = None if on_done is None else (lambda i, row: on_done(work[i], row))  # noqa: E731
  rows = parallel_map(functools.partial(_run, timer=timer), work, jobs, cb)
  if not keep_going:
    for job, row in zip(work, rows):
      if "error" in row:
        raise RunError(f"{job.label}: {row['error']}")
  return rows

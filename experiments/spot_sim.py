"""Spot-cluster simulation of RLBoost-style RL post-training: `python -m experiments.spot_sim`.

Replays a spot availability trace (default: Bamboo's p3 trace, shipped in the package, 50% of
its instances kept as RLBoost did, cut into 2-hour segments) against a reserved training cluster
and a pool of 2xH100 spot rollout instances, for each model preset and each setting (baselines,
RLBoost, ablations, our beyond-paper features switched off), driving the real rollout manager
and offload controller on a virtual clock (`jaxrl_sys.sim`). Prints one line per finished run,
then a table per preset (RLBoost vs co-located, per segment) and one over all settings; writes
each finished run to `runs.jsonl` as it completes, then `results.json` (byte-identical for a
seed), `timing.json` and one PNG per preset to --out_dir.

  python -m experiments.spot_sim                          # everything (minutes, 2 processes)
  python -m experiments.spot_sim --preset=qwen3-14b --settings=rlboost,restart --segments=0
  python -m experiments.spot_sim --preset=measured:benchmarks/results   # calibrated figures
  python -m experiments.spot_sim --paper      # every RLBoost figure beside ours (paper.json)
  python -m experiments.spot_sim --diagnose   # held-out per-step means + capped fleet

A bad flag or trace is one line on stderr and exit status 2; a run that fails is named
(preset, setting, segment) with its error, every other run still completes and is written,
and the exit status is 1.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

from absl import app, flags

from jaxrl_sys.rollout.elastic.trace_formats import FORMATS, bundled_trace, load_trace
from jaxrl_sys.sim import calibrate, diagnose, experiment, paper, report
from jaxrl_sys.sim.driver import SimConfig, Workload
from jaxrl_sys.sim.fit import FITTED, ROOFLINE
from jaxrl_sys.sim.presets import PRESETS, get_preset
from jaxrl_sys.sim.settings import get_settings
from jaxrl_sys.sim.startup import COLD_VM, WARM_RESTART

DEFAULT_TRACE = "bamboo/p3-trace.csv"
DEFAULT_SAMPLE = 0.5  # RLBoost kept a random half of the Bamboo trace's instances

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "all", "Comma list of presets (qwen3-8b, qwen3-14b, qwen3-32b), "
                    "'all', or 'measured:DIR' (calibrated from our benchmarks' JSON in DIR).")
flags.DEFINE_string("trace", None, "Spot trace file (formats: --trace_format). Default: "
                    f"Bamboo's p3 trace shipped in the package ({DEFAULT_TRACE}).")
flags.DEFINE_enum("trace_format", "auto", ["auto", *FORMATS], "Trace file format; auto tells "
                  "them apart (jaxrl_sys.rollout.elastic.trace_formats).")
flags.DEFINE_float("trace_time_scale", 1.0, "Multiplies every trace time (0.5: twice as fast).")
flags.DEFINE_float("segment_hours", 2.0, "Length of each trace segment (hours).")
flags.DEFINE_float("sample", None, "Fraction of the trace's instance ids kept, each with its "
                   f"whole history. Default: {DEFAULT_SAMPLE:g} for the default Bamboo trace "
                   "(as RLBoost did), 1 (all) for a --trace of your own.")
flags.DEFINE_integer("seed", 0, "Seed of the instance sample, response lengths and start-ups.")
flags.DEFINE_string("settings", "all", "Comma list of settings (see jaxrl_sys.sim.settings), or "
                    "'all'; the co-located baseline is always run.")
flags.DEFINE_string("segments", "", "Comma list of segment indices to run (default: all).")
flags.DEFINE_string("out_dir", "/tmp/spot_sim", "Where runs.jsonl, results.json, timing.json "
                    "and the PNGs go.")
flags.DEFINE_enum("startup", "cold", ["cold", "warm"], "Spot start-up: a new VM (120 s) or an "
                  "engine restart on a held machine (30 s, as in RLBoost's trace replay).")
flags.DEFINE_enum("model", "fitted", ["fitted", "roofline"], "Instance model: fitted to "
                  "RLBoost's static-pool, length-sweep and controller figures "
                  "(jaxrl_sys.sim.fit), or the roofline figures before the fit.")
flags.DEFINE_float("length_median", None, "Median response length (tokens); default: --model's.")
flags.DEFINE_float("length_sigma", None, "Sigma of log response length; default: --model's.")
flags.DEFINE_float("group_share", None, "Share of the log-length variance common to a group; "
                   "default: --model's.")
flags.DEFINE_bool("paper", False, "Run RLBoost's calibration points (static pools, length "
                  "sweep with the N_prem cap, windows) and the held-out figures (its Bamboo "
                  "table, ablations, break-even spot discount) and print every paper figure "
                  "beside ours with its band; writes paper.json.")
flags.DEFINE_bool("diagnose", False, "Run the held-out Bamboo segments (--segments, default "
                  "all) for the 8B/14B/32B presets (--diagnose_presets) and print per-step means "
                  "(instances, N_prem, T_seed, waits, step and training time, spot and reserved "
                  "$/h), plus a counterfactual with the spot fleet capped at the count the "
                  "paper's figures imply (jaxrl_sys.sim.diagnose; not adopted); writes "
                  "diagnose.json.")
flags.DEFINE_string("diagnose_presets", "qwen3-8b,qwen3-14b,qwen3-32b",
                    "Presets --diagnose runs (comma list).")
flags.DEFINE_bool("diagnose_cap", True, "--diagnose: also run the capped counterfactual.")
flags.DEFINE_integer("max_steps", 0, "Stop each run after this many steps (0: the segment).")
flags.DEFINE_integer("jobs", 2, "Worker processes.")
flags.DEFINE_bool("plots", True, "Write PNG plots.")


class UserError(ValueError):
  """A flag, trace or setting the simulator cannot use: one line, exit status 2."""


def _finite(name: str, value: float | None, low: float = 0.0, strict: bool = True) -> None:
  ok = value is None or (math.isfinite(value) and (value > low if strict else value >= low))
  if not ok:
    raise UserError(f"--{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                    f"got {value}")


def _check_flags() -> None:
  if FLAGS.jobs < 1:
    raise UserError(f"--jobs must be >= 1, got {FLAGS.jobs}")
  if FLAGS.max_steps < 0:
    raise UserError(f"--max_steps must be >= 0 (0: the whole segment), got {FLAGS.max_steps}")
  _finite("trace_time_scale", FLAGS.trace_time_scale)
  _finite("segment_hours", FLAGS.segment_hours)
  _finite("length_median", FLAGS.length_median)
  _finite("length_sigma", FLAGS.length_sigma, strict=False)
  _finite("group_share", FLAGS.group_share, strict=False)
  if FLAGS.sample is not None and not (math.isfinite(FLAGS.sample) and 0 <= FLAGS.sample <= 1):
    raise UserError(f"--sample must be in [0, 1], got {FLAGS.sample}")


def _fit():
  """The instance model with any length flag given on the command line."""
  fit = FITTED if FLAGS.model == "fitted" else ROOFLINE
  kw = {k: v for k, v in (("median", FLAGS.length_median), ("sigma", FLAGS.length_sigma),
                          ("group_share", FLAGS.group_share)) if v is not None}
  try:
    return dataclasses.replace(fit, **kw)
  except ValueError as err:
    raise UserError(f"response lengths (--length_median, --length_sigma, --group_share): "
                    f"{err}") from None


def _presets(spec: str, fit):
  if spec.startswith("measured:"):
    d = spec.split(":", 1)[1]

    def load(name, required=True):
      path = os.path.join(d, f"{name}.json")
      if not os.path.exists(path):
        if not required:
          return None
        raise UserError(f"--preset={spec}: {path} not found (run `python -m "
                        f"benchmarks.{name}` first; it writes benchmarks/results/{name}.json)")
      try:
        with open(path) as f:
          return json.load(f)
      except (OSError, ValueError) as err:
        raise UserError(f"--preset={spec}: cannot read {path}: {err}") from None

    return [calibrate.calibrate_from_benchmarks(load("generate"), load("grpo_step"),
                                                load("rollout_engine", False))]
  names = list(PRESETS) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
  if not names:
    raise UserError("--preset is empty")
  return [fit.apply(get_preset(n)) for n in names]


def _trace():
  """(trace, sample fraction): the trace file scaled in time, and the fraction of its
  instances to keep (`--sample`, or its default for this trace)."""
  path = FLAGS.trace or bundled_trace(DEFAULT_TRACE)
  trace = load_trace(path, FLAGS.trace_format)
  if FLAGS.trace_time_scale != 1.0:
    trace = trace.scale_time(FLAGS.trace_time_scale)
  sample = FLAGS.sample
  if sample is None:
    sample = DEFAULT_SAMPLE if FLAGS.trace is None else 1.0
    if FLAGS.trace is None:
      print(f"trace: {DEFAULT_TRACE}, {sample:.0%} of its instances kept as RLBoost did "
            "(--sample)", flush=True)
  return trace, sample


def _segments(trace):
  try:
    hours, segs = experiment.plan_segments(trace, FLAGS.segment_hours, FLAGS.segments)
  except ValueError as err:
    raise UserError(f"--trace={FLAGS.trace or DEFAULT_TRACE}: {err}") from None
  if hours != FLAGS.segment_hours:
    print(f"note: the trace spans {hours:.3g} h, less than --segment_hours="
          f"{FLAGS.segment_hours:g}: it runs as one {hours:.3g}-hour segment")
  return hours, segs


def _paper(trace, fit, sample):
  """--paper: the calibration points and the held-out figures beside RLBoost's."""
  out = paper.paper_report(trace, fit, FLAGS.segment_hours, sample, FLAGS.seed, FLAGS.jobs,
                           log=lambda msg: print(msg, flush=True))
  print(out["text"])
  with open(os.path.join(FLAGS.out_dir, "paper.json"), "w") as f:
    json.dump(out["json"], f, sort_keys=True, indent=1)


def _diagnose(trace, fit, sample):
  """--diagnose: per-step means of the held-out runs, uncapped and capped (sim.diagnose)."""
  implied = diagnose.implied_counts()
  caps = {k: max(1, round(v)) for k, v in implied.items()} if FLAGS.diagnose_cap else None
  rows = diagnose.diagnostic_rows(trace, caps, fit, FLAGS.diagnose_presets.split(","),
                                  FLAGS.segment_hours, sample, FLAGS.seed, FLAGS.jobs,
                                  FLAGS.segments)
  summary = diagnose.summarize(rows)
  print(f"== held-out diagnostics ({trace.name}; means over steps, then segments; 'impl' = "
        f"spot instances the paper's figures imply; caps {caps}; capped = not adopted) ==\n"
        f"{diagnose.table(summary, implied)}\n\nper segment:\n"
        f"{diagnose.table(diagnose.summarize(rows, per_segment=True), implied)}")
  with open(os.path.join(FLAGS.out_dir, "diagnose.json"), "w") as f:
    json.dump({"implied": implied, "caps": caps, "summary": summary, "rows": rows}, f,
              sort_keys=True)


def _progress(runs_file, total: int, t_start: float):
  """The on_done callback of the grid: one line per finished run, its row appended to
  runs.jsonl at once (a later failure loses nothing)."""
  done = [0]

  def on_done(job, row):
    done[0] += 1
    runs_file.write(json.dumps({k: v for k, v in row.items() if k != "sim_seconds"},
                               sort_keys=True) + "\n")
    runs_file.flush()
    head = f"[{done[0]}/{total}] {job.label}"
    if "error" in row:
      print(f"{head}: FAILED: {row['error'].splitlines()[0][:300]}", flush=True)
      return
    r = row["result"]
    print(f"{head}: {len(r['steps'])} steps, {r['throughput']:,.0f} tok/s, "
          f"${r['cost_per_mtok']:.2f}/Mtok ({row['sim_seconds']:.1f} s; "
          f"{time.perf_counter() - t_start:.0f} s so far)", flush=True)
  return on_done


def _run(t_start: float) -> int:
  _check_flags()
  fit = _fit()
  trace, sample = _trace()
  presets = _presets(FLAGS.preset, fit)
  settings = get_settings(FLAGS.settings)
  try:
    os.makedirs(FLAGS.out_dir, exist_ok=True)
  except OSError as err:
    raise UserError(f"--out_dir={FLAGS.out_dir}: {err}") from None
  if FLAGS.paper:
    _paper(trace, fit, sample)
    return 0
  if FLAGS.diagnose:
    _diagnose(trace, fit, sample)
    return 0
  if sample != 1.0:
    trace = trace.sample(sample, FLAGS.seed)
  hours, segs = _segments(trace)
  seg_names = [name for name, _ in segs]
  lengths = fit.lengths()
  bases = {}
  for p in presets:
    bases[p.name] = SimConfig(
        p, workload=Workload(lengths=lengths), engine=fit.engine(),
        startup=COLD_VM if FLAGS.startup == "cold" else WARM_RESTART, horizon=hours * 3600.0,
        seed=FLAGS.seed, max_steps=FLAGS.max_steps or None)
  disagg, probes = {}, {}
  if any(s.mode == "disagg" for s in settings):
    print(f"sizing Disagg.BAL's reserved rollout pool ({len(experiment.DISAGG_CANDIDATES)} "
          f"sizes x {len(bases)} preset(s), 2 steps each)", flush=True)
    disagg, probes = experiment.size_disagg(bases, jobs=FLAGS.jobs)
    print("Disagg.BAL pool: " + ", ".join(f"{k} {v}" for k, v in disagg.items()), flush=True)
  n_runs = len(experiment.grid_jobs(bases, settings, segs, disagg))
  print(f"{n_runs} runs: {len(bases)} preset(s) x {len(settings)} setting(s) over "
        f"{len(segs)} segment(s) of {hours:.3g} h of {trace.name} ({FLAGS.jobs} processes); "
        f"each is written to {os.path.join(FLAGS.out_dir, 'runs.jsonl')} as it finishes",
        flush=True)
  with open(os.path.join(FLAGS.out_dir, "runs.jsonl"), "w") as runs_file:
    rows = experiment.run_grid(bases, settings, segs, FLAGS.jobs, disagg,
                               timer=time.perf_counter,
                               on_done=_progress(runs_file, n_runs, t_start), keep_going=True)
  failed = [r for r in rows if "error" in r]
  if failed:
    with open(os.path.join(FLAGS.out_dir, "errors.log"), "w") as f:
      for r in failed:
        f.write(f"== {r['preset']} {r['setting']} {r['segment'] or ''}\n{r['traceback']}\n")
  bad = {r["preset"] for r in failed}
  ok_rows = [r for r in rows if r["preset"] not in bad]
  summary = report.summarize(ok_rows, seg_names) if ok_rows else {}
  names = [n for n in bases if n not in bad]
  for name in names if any(s.name == "rlboost" for s in settings) else ():
    print(f"\n== {name}: RLBoost vs co-located veRL, trace {trace.name}, "
          f"{hours:.3g} h segments ==")
    print(report.segment_table(summary, name, seg_names))
    print(f"({report.SPOT_LEGEND})")
  if summary:
    print("\n== all settings (mean over segments; ratios vs co-located veRL) ==")
    print(report.settings_table(summary))
  meta = {"trace": trace.name, "segment_hours": hours, "model": FLAGS.model,
          "sample": sample, "seed": FLAGS.seed, "startup": FLAGS.startup,
          "lengths": dataclasses.asdict(lengths),
          "segments": {n: {"mean_available": tr.mean_live()} for n, tr in segs},
          "disagg_instances": disagg, "disagg_probe_throughput": probes,
          "settings": [s.name for s in settings], "presets": list(bases)}
  runs = [{k: v for k, v in r.items() if k not in ("sim_seconds", "traceback")} for r in rows]
  with open(os.path.join(FLAGS.out_dir, "results.json"), "w") as f:
    json.dump({"meta": meta, "summary": summary, "runs": runs}, f, sort_keys=True, indent=1)
  timing = {"total_s": time.perf_counter() - t_start, "jobs": FLAGS.jobs,
            "runs": [{k: r[k] for k in ("preset", "setting", "segment", "sim_seconds")}
                     for r in rows]}
  with open(os.path.join(FLAGS.out_dir, "timing.json"), "w") as f:
    json.dump(timing, f, indent=1)
  if FLAGS.plots:
    for name in names:
      report.plot(ok_rows, name, seg_names, os.path.join(FLAGS.out_dir, f"{name}.png"),
                  [s for s in ("rlboost", "no_memory", "no_seeding") if s in
                   [x.name for x in settings]] or ["rlboost"])
  slowest = max(rows, key=lambda r: r["sim_seconds"])
  print(f"\n{len(rows)} runs in {timing['total_s']:.0f} s ({FLAGS.jobs} processes); slowest "
        f"{slowest['sim_seconds']:.1f} s ({slowest['preset']} {slowest['setting']} "
        f"{slowest['segment'] or ''}); results in {FLAGS.out_dir}")
  for r in failed:
    print(f"error: run {r['preset']} {r['setting']} {r['segment'] or ''}: {r['error']} "
          f"(traceback in {os.path.join(FLAGS.out_dir, 'errors.log')}; the other runs are in "
          "results.json)", file=sys.stderr)
  return 1 if failed else 0


def main(argv):
  t_start = time.perf_counter()
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]} (flags are --name=value)", file=sys.stderr)
    return 2
  try:
    return _run(t_start)
  except experiment.RunError as err:  # --paper, --diagnose: a run failed (named)
    print(f"error: run {err}", file=sys.stderr)
    return 1
  except (ValueError, FileNotFoundError) as err:  # every user error; the runs report their own
    print(f"error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  app.run(main)

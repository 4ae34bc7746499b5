"""Spot-cluster simulation of RLBoost-style RL post-training: `python -m experiments.spot_sim`.

Replays a spot availability trace (default: Bamboo's p3 trace, 50% of its instances kept as
RLBoost did, cut into 2-hour segments) against a reserved training cluster and a pool of 2xH100
spot rollout instances, for each model preset and each setting (baselines, RLBoost, ablations,
our beyond-paper features switched off), driving the real rollout manager and offload controller
on a virtual clock (`jaxrl_sys.sim`). Prints a table per preset (RLBoost vs co-located, per
segment) and one over all settings; writes `results.json` (byte-identical for a seed),
`timing.json` and one PNG per preset (spot instances, T_seed and step time over the trace) to
--out_dir.

  python -m experiments.spot_sim                          # everything (minutes, 2 processes)
  python -m experiments.spot_sim --preset=qwen3-14b --settings=rlboost,restart --segments=0
  python -m experiments.spot_sim --preset=measured:benchmarks/results   # calibrated figures
  python -m experiments.spot_sim --paper      # every RLBoost figure beside ours (paper.json)
  python -m experiments.spot_sim --diagnose   # held-out per-step means + capped fleet
  python -m experiments.spot_sim --lora_rank=16 --settings=rlboost  # + adapter-only weight sync
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

from absl import app, flags

from jaxrl_sys.rollout.elastic.trace_formats import FORMATS, load_trace, traces_dir
from jaxrl_sys.sim import calibrate, diagnose, experiment, paper, report
from jaxrl_sys.sim.driver import SimConfig, Workload
from jaxrl_sys.sim.fit import FITTED, ROOFLINE
from jaxrl_sys.sim.presets import PRESETS, get_preset, with_lora
from jaxrl_sys.sim.settings import get_settings
from jaxrl_sys.sim.startup import COLD_VM, WARM_RESTART

_P3 = os.path.join(traces_dir(), "bamboo", "p3-trace.csv")

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "all", "Comma list of presets (qwen3-8b, qwen3-14b, qwen3-32b), "
                    "'all', or 'measured:DIR' (calibrated from our benchmarks' JSON in DIR).")
flags.DEFINE_string("trace", _P3, "Spot trace file (formats: --trace_format).")
flags.DEFINE_enum("trace_format", "auto", ["auto", *FORMATS], "Trace file format; auto tells "
                  "them apart (jaxrl_sys.rollout.elastic.trace_formats).")
flags.DEFINE_float("trace_time_scale", 1.0, "Multiplies every trace time (0.5: twice as fast).")
flags.DEFINE_float("segment_hours", 2.0, "Length of each trace segment (hours).")
flags.DEFINE_float("sample", 0.5, "Fraction of the trace's instances kept (RLBoost: 0.5).")
flags.DEFINE_integer("seed", 0, "Seed of the instance sample, response lengths and start-ups.")
flags.DEFINE_string("settings", "all", "Comma list of settings (see jaxrl_sys.sim.settings), or "
                    "'all'; the co-located baseline is always run.")
flags.DEFINE_string("segments", "", "Comma list of segment indices to run (default: all).")
flags.DEFINE_string("out_dir", "/tmp/spot_sim", "Where results.json, timing.json, PNGs go.")
flags.DEFINE_enum("startup", "cold", ["cold", "warm"], "Spot start-up: a new VM (120 s) or an "
                  "engine restart on a held machine (30 s, as in RLBoost's trace replay).")
flags.DEFINE_enum("model", "fitted", ["fitted", "roofline"], "Instance model: fitted to "
                  "RLBoost's static-pool and length-sweep points (jaxrl_sys.sim.fit), or the "
                  "roofline figures before the fit.")
flags.DEFINE_float("length_median", None, "Median response length (tokens); default: --model's.")
flags.DEFINE_float("length_sigma", None, "Sigma of log response length; default: --model's.")
flags.DEFINE_float("group_share", None, "Share of the log-length variance common to a group; "
                   "default: --model's.")
flags.DEFINE_bool("paper", False, "Run RLBoost's calibration points and its Bamboo table "
                  "(held out) and print every paper figure beside ours; writes paper.json.")
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
flags.DEFINE_integer("lora_rank", 0, "Also run each preset trained with LoRA of this rank and "
                     "adapter-only weight sync (a spot instance pulls the base once, then the "
                     "adapters per version: jaxrl_sys.sim.presets.with_lora); 0: off.")
flags.DEFINE_string("lora_targets", "attention,mlp", "The LoRA targets --lora_rank sizes the "
                    "adapters for (the --lora.targets names of experiments.grpo).")


def _fit():
  """The instance model with any length flag given on the command line."""
  fit = FITTED if FLAGS.model == "fitted" else ROOFLINE
  kw = {k: v for k, v in (("median", FLAGS.length_median), ("sigma", FLAGS.length_sigma),
                          ("group_share", FLAGS.group_share)) if v is not None}
  return dataclasses.replace(fit, **kw)


def _presets(spec: str, fit):
  if spec.startswith("measured:"):
    d = spec.split(":", 1)[1]

    def load(name, required=True):
      path = os.path.join(d, f"{name}.json")
      if not os.path.exists(path) and not required:
        return None
      with open(path) as f:
        return json.load(f)

    return [calibrate.calibrate_from_benchmarks(load("generate"), load("grpo_step"),
                                                load("rollout_engine", False))]
  names = list(PRESETS) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
  presets = [fit.apply(get_preset(n)) for n in names]
  if FLAGS.lora_rank:
    presets += [with_lora(p, FLAGS.lora_rank, FLAGS.lora_targets) for p in presets]
  return presets


def _trace():
  trace = load_trace(FLAGS.trace, FLAGS.trace_format)
  if FLAGS.trace_time_scale != 1.0:
    trace = trace.scale_time(FLAGS.trace_time_scale)
  return trace


def _segments(trace):
  try:
    hours, segs = experiment.plan_segments(trace, FLAGS.segment_hours, FLAGS.segments)
  except ValueError as err:
    raise app.UsageError(f"--trace={FLAGS.trace}: {err}") from None
  if hours != FLAGS.segment_hours:
    print(f"note: the trace spans {hours:.3g} h, less than --segment_hours="
          f"{FLAGS.segment_hours:g}: it runs as one {hours:.3g}-hour segment")
  return hours, segs


def _paper(trace, fit):
  """--paper: the calibration points and the held-out Bamboo table beside RLBoost's."""
  cal = paper.calibration_points(fit, jobs=FLAGS.jobs)
  rel = paper.release_points(fit, jobs=FLAGS.jobs)
  val = paper.validation_points(trace, fit, FLAGS.segment_hours, FLAGS.sample, FLAGS.seed,
                                FLAGS.jobs)
  print(f"== calibration (fitted; Qwen3-14B static pool, steady state) ==\n"
        f"{paper.paper_table(cal, paper.CALIBRATION)}")
  print(f"\n== calibration (fitted; the release's REPRODUCE.md, Qwen3-8B static pools) ==\n"
        f"{paper.paper_table(rel, paper.RELEASE_8B)}")
  print(f"\n== validation (held out; {trace.name}, {FLAGS.sample:g} of the instances, "
        f"{FLAGS.segment_hours:g} h segments, mean) ==\n"
        f"{paper.paper_table(val, paper.VALIDATION)}")
  for label, segs in val["segments"].items():
    print(f"  {label} per segment (x, ce, instances used): " + ", ".join(
        f"{k} {x:.2f}/{c:.2f}/{n:.1f}" for k, (x, c, n) in segs.items()))
  out = {"fit": dataclasses.asdict(fit), "calibration": {"paper": paper.CALIBRATION, "ours": cal},
         "release_8b": {"paper": paper.RELEASE_8B, "ours": rel},
         "validation": {"paper": paper.VALIDATION, "ours": val}, "trace": trace.name}
  with open(os.path.join(FLAGS.out_dir, "paper.json"), "w") as f:
    json.dump(out, f, sort_keys=True, indent=1)


def _diagnose(trace, fit):
  """--diagnose: per-step means of the held-out runs, uncapped and capped (sim.diagnose)."""
  implied = diagnose.implied_counts()
  caps = {k: max(1, round(v)) for k, v in implied.items()} if FLAGS.diagnose_cap else None
  rows = diagnose.diagnostic_rows(trace, caps, fit, FLAGS.diagnose_presets.split(","),
                                  FLAGS.segment_hours, FLAGS.sample, FLAGS.seed, FLAGS.jobs,
                                  FLAGS.segments)
  summary = diagnose.summarize(rows)
  print(f"== held-out diagnostics ({trace.name}; means over steps, then segments; 'impl' = "
        f"spot instances the paper's figures imply; caps {caps}; capped = not adopted) ==\n"
        f"{diagnose.table(summary, implied)}\n\nper segment:\n"
        f"{diagnose.table(diagnose.summarize(rows, per_segment=True), implied)}")
  with open(os.path.join(FLAGS.out_dir, "diagnose.json"), "w") as f:
    json.dump({"implied": implied, "caps": caps, "summary": summary, "rows": rows}, f,
              sort_keys=True)


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  t_start = time.perf_counter()
  fit = _fit()
  trace = _trace()
  if FLAGS.paper:
    _paper(trace, fit)
    return
  if FLAGS.diagnose:
    _diagnose(trace, fit)
    return
  trace = trace.sample(FLAGS.sample, FLAGS.seed)
  hours, segs = _segments(trace)
  seg_names = [name for name, _ in segs]
  avail = {name: tr.mean_live() for name, tr in segs}
  settings = get_settings(FLAGS.settings)
  lengths = fit.lengths()
  bases = {}
  for p in _presets(FLAGS.preset, fit):
    bases[p.name] = SimConfig(
        p, workload=Workload(lengths=lengths), engine=fit.engine(),
        startup=COLD_VM if FLAGS.startup == "cold" else WARM_RESTART, horizon=hours * 3600.0,
        seed=FLAGS.seed,
        max_steps=FLAGS.max_steps or None)
  disagg, probes = {}, {}
  if any(s.mode == "disagg" for s in settings):
    disagg, probes = experiment.size_disagg(bases, jobs=FLAGS.jobs)
  rows = experiment.run_grid(bases, settings, segs, FLAGS.jobs, disagg, timer=time.perf_counter)
  summary = report.summarize(rows, seg_names)
  for name in bases if any(s.name == "rlboost" for s in settings) else ():
    print(f"\n== {name}: RLBoost vs co-located veRL, trace {trace.name}, "
          f"{hours:.3g} h segments ==")
    print(report.segment_table(summary, name, seg_names, avail))
  print("\n== all settings (mean over segments; ratios vs co-located veRL) ==")
  print(report.settings_table(summary))
  meta = {"trace": trace.name, "segment_hours": hours, "model": FLAGS.model,
          "sample": FLAGS.sample,
          "seed": FLAGS.seed, "startup": FLAGS.startup, "lengths": dataclasses.asdict(lengths),
          "segments": {n: {"mean_available": avail[n]} for n in seg_names},
          "disagg_instances": disagg, "disagg_probe_throughput": probes,
          "settings": [s.name for s in settings], "presets": list(bases)}
  runs = [{k: v for k, v in r.items() if k != "sim_seconds"} for r in rows]
  with open(os.path.join(FLAGS.out_dir, "results.json"), "w") as f:
    json.dump({"meta": meta, "summary": summary, "runs": runs}, f, sort_keys=True, indent=1)
  timing = {"total_s": time.perf_counter() - t_start, "jobs": FLAGS.jobs,
            "runs": [{k: r[k] for k in ("preset", "setting", "segment", "sim_seconds")}
                     for r in rows]}
  with open(os.path.join(FLAGS.out_dir, "timing.json"), "w") as f:
    json.dump(timing, f, indent=1)
  if FLAGS.plots:
    for name in bases:
      report.plot(rows, name, seg_names, os.path.join(FLAGS.out_dir, f"{name}.png"),
                  [s for s in ("rlboost", "no_memory", "no_seeding") if s in
                   [x.name for x in settings]] or ["rlboost"])
  slowest = max(rows, key=lambda r: r["sim_seconds"])
  print(f"\n{len(rows)} runs in {timing['total_s']:.0f} s ({FLAGS.jobs} processes); slowest "
        f"{slowest['sim_seconds']:.1f} s ({slowest['preset']} {slowest['setting']} "
        f"{slowest['segment']}); results in {FLAGS.out_dir}")


if __name__ == "__main__":
  app.run(main)

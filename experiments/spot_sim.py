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
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

from absl import app, flags

from jaxrl_sys.rollout.elastic.traces import load_trace
from jaxrl_sys.sim import calibrate, experiment, report
from jaxrl_sys.sim.driver import SimConfig, Workload
from jaxrl_sys.sim.lengths import LengthDistribution
from jaxrl_sys.sim.presets import PRESETS, get_preset
from jaxrl_sys.sim.settings import get_settings
from jaxrl_sys.sim.startup import COLD_VM, WARM_RESTART

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_P3 = os.path.join(_REPO, "..", "shared", "traces", "bamboo", "p3-trace.csv")

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "all", "Comma list of presets (qwen3-8b, qwen3-14b, qwen3-32b), "
                    "'all', or 'measured:DIR' (calibrated from our benchmarks' JSON in DIR).")
flags.DEFINE_string("trace", _P3, "Spot trace (Bamboo CSV or Parcae JSON lines).")
flags.DEFINE_float("segment_hours", 2.0, "Length of each trace segment (hours).")
flags.DEFINE_float("sample", 0.5, "Fraction of the trace's instances kept (RLBoost: 0.5).")
flags.DEFINE_integer("seed", 0, "Seed of the instance sample, response lengths and start-ups.")
flags.DEFINE_string("settings", "all", "Comma list of settings (see jaxrl_sys.sim.settings), or "
                    "'all'; the co-located baseline is always run.")
flags.DEFINE_string("segments", "", "Comma list of segment indices to run (default: all).")
flags.DEFINE_string("out_dir", "/tmp/spot_sim", "Where results.json, timing.json, PNGs go.")
flags.DEFINE_enum("startup", "cold", ["cold", "warm"], "Spot start-up: a new VM (120 s) or an "
                  "engine restart on a held machine (30 s, as in RLBoost's trace replay).")
flags.DEFINE_float("length_median", 4000.0, "Median response length (tokens).")
flags.DEFINE_float("length_sigma", 0.9, "Sigma of log response length.")
flags.DEFINE_float("group_share", 0.5, "Share of the log-length variance common to a group.")
flags.DEFINE_integer("max_steps", 0, "Stop each run after this many steps (0: the segment).")
flags.DEFINE_integer("jobs", 2, "Worker processes.")
flags.DEFINE_bool("plots", True, "Write PNG plots.")


def _presets(spec: str):
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
  return [get_preset(n) for n in names]


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  t_start = time.perf_counter()
  trace = load_trace(FLAGS.trace).sample(FLAGS.sample, FLAGS.seed)
  segs = experiment.segments(trace, FLAGS.segment_hours)
  if FLAGS.segments:
    segs = [segs[int(i)] for i in FLAGS.segments.split(",")]
  seg_names = [name for name, _ in segs]
  avail = {name: tr.mean_live() for name, tr in segs}
  settings = get_settings(FLAGS.settings)
  lengths = LengthDistribution(FLAGS.length_median, FLAGS.length_sigma,
                               group_share=FLAGS.group_share)
  bases = {}
  for p in _presets(FLAGS.preset):
    bases[p.name] = SimConfig(
        p, workload=Workload(lengths=lengths), startup=COLD_VM if FLAGS.startup == "cold"
        else WARM_RESTART, horizon=FLAGS.segment_hours * 3600.0, seed=FLAGS.seed,
        max_steps=FLAGS.max_steps or None)
  disagg, probes = {}, {}
  if any(s.mode == "disagg" for s in settings):
    disagg, probes = experiment.size_disagg(bases, jobs=FLAGS.jobs)
  rows = experiment.run_grid(bases, settings, segs, FLAGS.jobs, disagg, timer=time.perf_counter)
  summary = report.summarize(rows, seg_names)
  for name in bases if any(s.name == "rlboost" for s in settings) else ():
    print(f"\n== {name}: RLBoost vs co-located veRL, trace {trace.name}, "
          f"{FLAGS.segment_hours:g} h segments ==")
    print(report.segment_table(summary, name, seg_names, avail))
  print("\n== all settings (mean over segments; ratios vs co-located veRL) ==")
  print(report.settings_table(summary))
  meta = {"trace": trace.name, "segment_hours": FLAGS.segment_hours, "sample": FLAGS.sample,
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

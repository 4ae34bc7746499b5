"""Algorithm claims, measured: the regime in which each published claim should show, >= 5 seeds,
means with 95% intervals, a verdict per claim.

Usage: python -m benchmarks.algorithms [--quick] [--seeds 5] [--only mc_grpo,vcpo,...]
                                      [--merge benchmarks/results/algorithms.json [--rerun R]]

`--merge` reuses a previous file's runs of every cell whose settings and seeds are unchanged
and runs the rest (a new or changed regime), then rebuilds the whole table.

Every RL run goes through the public recipe API (`build_recipe` / `run_recipe`) on the tiny
preset and a task shipped in `jaxrl_sys.tasks`; the MoE regime pre-trains the tiny MoE preset.
A comparison pairs the two arms by seed (same initial weights, same warm-up, same prompts): its
interval is the t-interval of the per-seed differences B - A, oriented so that positive means
"as claimed". Verdict: "reproduced" when that interval lies above 0; "not reproduced" when it
lies below 0, or inside (-delta, +delta) (no effect of the smallest size of interest); "not
measurable at this scale" when it straddles 0 wider than that, or when the mechanism the claim
rests on is inactive in the runs (said in the verdict). Regimes (see docs/algorithms.md):

  mc_grpo   MC-GRPO vs GRPO at G = 2, 3, 4, equal samples per step (MC-GRPO's G + 1 counted),
            sparse rewards (a short warm-up: ~10% success at the start); held-out accuracy.
  vcpo      VCPO vs GRPO, async, max_staleness 0 / 2 / 8 / 16, lr 5e-3, KL 0.04 and 0.
  dapo      DAPO clip-higher (0.2 / 0.28) vs symmetric (0.2 / 0.2): entropy over time, with
            the ratio against the rollout's log-probs (coupled PPO, async max_staleness 8) so
            that the clip binds (its share of tokens is reported), lr 1e-3 and 5e-3.
  drgrpo    GRPO vs Dr. GRPO (both KL 0) on arithmetic with free trailing length (`filler`):
            length drift of the incorrect responses.
  moe       BIP vs aux-loss vs aux-free on the tiny MoE preset (LM pre-training): MaxVio, loss.
  collapse  the policy-collapse note (`train.loop.collapse`) on the no-KL stress runs and on
            the quick-start settings.

Writes benchmarks/results/algorithms.json (algorithms_quick.json with --quick).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

from benchmarks.algorithms_cells import Cell, cell, fingerprint, reusable, run
from benchmarks.algorithms_stats import Comparison, collapse_row, compare, fmt
from benchmarks.common import print_table, write_json

REGIMES = ("mc_grpo", "vcpo", "dapo", "drgrpo", "moe", "collapse")
STRESS = dict(mode="async", max_staleness=8, learning_rate=5e-3)  # the stress settings


# ----- the regimes ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Sizes:
  """Run sizes: the full benchmark, or `--quick` (seconds per regime, for smoke tests)."""
  seeds: int
  eval_prompts: int
  mc_groups: tuple
  mc_budget: int   # samples per step of both arms
  mc_steps: int
  vcpo_staleness: tuple
  vcpo_kl: tuple
  rl_steps: int    # vcpo, dapo
  rl_prompts: int  # vcpo, dapo, drgrpo
  drgrpo_steps: int
  moe_steps: int
  moe_batch: tuple  # (sequences, tokens) per pre-training step
  collapse_steps: int | None  # None: the recipe's default (100)
  collapse_prompts: int | None  # None: the recipe's default (64)
  collapse_seeds: int  # seeds of each collapse run


def sizes(quick: bool) -> Sizes:
  if quick:
    return Sizes(seeds=2, eval_prompts=16, mc_groups=(2,), mc_budget=24, mc_steps=6,
                 vcpo_staleness=(8,), vcpo_kl=(0.04,), rl_steps=6, rl_prompts=8, drgrpo_steps=6,
                 moe_steps=5, moe_batch=(8, 33), collapse_steps=24, collapse_prompts=32,
                 collapse_seeds=1)
  return Sizes(seeds=5, eval_prompts=64, mc_groups=(2, 3, 4), mc_budget=60, mc_steps=150,
               vcpo_staleness=(0, 2, 8, 16), vcpo_kl=(0.04, 0.0), rl_steps=50, rl_prompts=32,
               drgrpo_steps=100, moe_steps=300, moe_batch=(16, 65), collapse_steps=None,
               collapse_prompts=None, collapse_seeds=5)



def _dapo_inactive(a_runs, b_runs) -> str | None:
  if max(r["clip_frac_max"] for r in a_runs + b_runs) > 0:
    return None
  return ("not measurable at this scale: no clip ever binds (clip_frac 0 at every step; one "
          "update per batch makes the ratio to the proximal policy exactly 1)")


def comparisons(s: Sizes, only) -> list[Comparison]:
  """The benchmark's comparisons, regime by regime (see the module docstring)."""
  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.tasks import make_task
  out = []
  ev = lambda steps: dict(eval_every=steps, eval_prompts=s.eval_prompts)  # noqa: E731 (at the end)
  if "mc_grpo" in only:
    for g in s.mc_groups:
      base = dict(group_size=g, steps=s.mc_steps, sft_steps=30, **ev(s.mc_steps))
      a = cell(f"grpo G={g} n={s.mc_budget}", algo="grpo", prompts_per_step=s.mc_budget // g,
               **base)
      b = cell(f"mc_grpo G={g} n={s.mc_budget}", algo="mc_grpo",
               prompts_per_step=s.mc_budget // (g + 1), **base)
      out.append(Comparison(
          "mc_grpo", "MC-GRPO beats GRPO at small G",
          f"G={g}, {s.mc_budget} samples/step (GRPO {s.mc_budget // g} x {g}, MC-GRPO "
          f"{s.mc_budget // (g + 1)} x {g + 1}), arithmetic, warm-up 30 (sparse), lr 1e-3",
          "eval_reward", a, b, +1, 0.05))
  if "vcpo" in only:
    for kl in s.vcpo_kl:
      for st in s.vcpo_staleness:
        base = dict(mode="async", max_staleness=st, learning_rate=5e-3, kl_coef=kl,
                    steps=s.rl_steps, prompts_per_step=s.rl_prompts, **ev(s.rl_steps))
        a = cell(f"grpo async eta={st} kl={kl}", algo="grpo", **base)
        b = cell(f"vcpo async eta={st} kl={kl}", algo="vcpo", **base)
        out.append(Comparison(
            "vcpo", "VCPO beats GRPO off-policy", f"async max_staleness={st}, lr 5e-3, KL {kl}",
            "eval_reward", a, b, +1, 0.05))
        if kl and st >= 8:
          # Control: VCPO's ESS scale multiplies the step by ~0.6 at this staleness (the
          # lr_scale metric); GRPO at lr 3e-3 asks whether the gain is just a smaller step.
          slow = cell(f"grpo async eta={st} kl={kl} lr=3e-3", algo="grpo",
                      **dict(base, learning_rate=3e-3))
          out.append(Comparison(
              "vcpo", "... and GRPO at VCPO's mean step", f"async max_staleness={st}, GRPO lr "
              f"3e-3 vs VCPO lr 5e-3 (ESS scale ~0.6), KL {kl}", "eval_reward", slow, b, +1,
              0.05))
        if kl and st == max(s.vcpo_staleness):
          # The same staleness at a learning rate where GRPO learns stably (the tiny preset's).
          stable = dict(base, learning_rate=1e-3)
          out.append(Comparison(
              "vcpo", "VCPO beats GRPO off-policy", f"async max_staleness={st}, lr 1e-3 "
              f"(stable), KL {kl}", "eval_reward",
              cell(f"grpo async eta={st} kl={kl} lr=1e-3", algo="grpo", **stable),
              cell(f"vcpo async eta={st} kl={kl} lr=1e-3", algo="vcpo", **stable), +1, 0.05))
  if "dapo" in only:
    # Coupled PPO (the ratio against the rollout's log-probs): stale samples move the ratio
    # off 1, so the clip binds, as it does in DAPO's several updates per rollout batch. With
    # the trainer's default anchor (the proximal policy, one update per step) it never binds.
    coupled = {"decoupled": False, "old_policy": "behaviour"}
    for lr in (1e-3, 5e-3):
      base = dict(algo="dapo", steps=s.rl_steps, prompts_per_step=s.rl_prompts,
                  **dict(STRESS, learning_rate=lr), **ev(s.rl_steps))
      a = cell(f"dapo coupled clip 0.2/0.2 lr={lr:g}", loss=dict(coupled, clip_eps_high=0.2),
               **base)
      b = cell(f"dapo coupled clip 0.2/0.28 lr={lr:g}", loss=coupled, **base)
      out.append(Comparison(
          "dapo", "clip-higher keeps entropy up", f"DAPO preset (KL 0), coupled PPO ratio, "
          f"async max_staleness=8, lr {lr:g}", "entropy_last", a, b, +1, 0.05, _dapo_inactive))
  if "drgrpo" in only:
    task = lambda: make_task("arithmetic", num_digits=1, ops="+", filler=8)  # noqa: E731
    base = dict(kl_coef=0.0, steps=s.drgrpo_steps, prompts_per_step=s.rl_prompts,
                max_new_tokens=12, **ev(s.drgrpo_steps))
    a = cell("drgrpo filler=8 kl=0", algo="drgrpo", task=task, lengths=True, **base)
    b = cell("grpo filler=8 kl=0", algo="grpo", task=task, lengths=True, **base)
    out.append(Comparison(
        "drgrpo", "GRPO lengthens incorrect responses (Dr. GRPO does not)",
        "arithmetic filler=8 (free trailing length), KL 0 both, lr 1e-3",
        "incorrect_len_drift", a, b, +1, 1.0))
  if "moe" in only:
    arm = lambda m: cell(f"moe {m}", kind="moe", balancing=m, steps=s.moe_steps,  # noqa: E731
                         batch=s.moe_batch)
    setting = (f"tiny_moe preset (4 experts, top-2), {s.moe_steps} steps LM pre-training, "
               f"{s.moe_batch[0]} x {s.moe_batch[1] - 1} tokens/step, Zipf Markov corpus")
    for metric, delta, what in (("maxvio_mean", 0.02, "lower MaxVio"),
                                ("lm_loss_last", 0.01, "lower LM loss")):
      out.append(Comparison("moe", f"aux-free: {what} than aux-loss", setting, metric,
                            arm("aux_loss"), arm("aux_free"), -1, delta))
      out.append(Comparison("moe", f"BIP: {what} than aux-free", setting, metric,
                            arm("aux_free"), arm("bip"), -1, delta))
  return out


def collapse_cells(s: Sizes, quick: bool) -> list[Cell]:
  """The acceptance runs of the collapse note: the no-KL stress run (GRPO, and the vcpo
  preset) and the quick-start settings (the recipe's defaults)."""
  size = {k: v for k, v in (("steps", s.collapse_steps), ("prompts_per_step",
                                                          s.collapse_prompts)) if v}
  cells = [cell("stress grpo kl=0", kl_coef=0.0, **STRESS, **size)]
  if not quick:
    cells.append(cell("stress vcpo preset", algo="vcpo", **STRESS, **size))
  return cells + [cell("quick-start defaults", **size)]




def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="tiny sizes, 2 seeds: a smoke run")
  ap.add_argument("--seeds", type=int, default=None, help="seeds per arm (default 5; quick 2)")
  ap.add_argument("--only", default=",".join(REGIMES),
                  help=f"comma-separated regimes among {','.join(REGIMES)} (default all)")
  ap.add_argument("--out", default=None, help="results name (default algorithms / "
                  "algorithms_quick)")
  ap.add_argument("--merge", default=None, metavar="JSON",
                  help="a previous results file: its runs of cells with the same settings and "
                  "seeds are reused, only the others run (new or changed regimes)")
  ap.add_argument("--rerun", default="", help="with --merge: comma-separated regimes whose "
                  "cells run again even if the file has them")
  args = ap.parse_args(argv)
  only = [r.strip() for r in args.only.split(",") if r.strip()]
  rerun = {r.strip() for r in args.rerun.split(",") if r.strip()}
  bad = sorted((set(only) | rerun) - set(REGIMES))
  if bad:
    ap.error(f"unknown regime(s) {bad}; choose among {REGIMES}")
  prev = None
  if args.merge:
    try:
      with open(args.merge, encoding="utf-8") as f:
        prev = json.load(f)
    except (OSError, ValueError) as e:
      ap.error(f"--merge {args.merge}: cannot read a results file ({e}); run without --merge")
    if prev.get("quick") != args.quick:
      ap.error(f"--merge {args.merge}: quick={prev.get('quick')} results do not mix with "
               f"quick={args.quick} runs")
  s = sizes(args.quick)
  if args.seeds is not None:
    if args.seeds < 2:
      ap.error("--seeds must be >= 2 (an interval needs two)")
    s = dataclasses.replace(s, seeds=args.seeds, collapse_seeds=args.seeds)
  comps = comparisons(s, only)
  cells, regime = {}, {}
  for c in comps:
    for x in (c.a, c.b):
      cells.setdefault(x.name, x)
      regime.setdefault(x.name, c.regime)
  col = collapse_cells(s, args.quick) if "collapse" in only else []
  cells.update({c.name: c for c in col})
  regime.update({c.name: "collapse" for c in col})
  runs, timing, reused = {}, {}, []
  t_all, c_all = time.perf_counter(), time.process_time()
  for name, c in cells.items():
    seeds = s.collapse_seeds if regime[name] == "collapse" else s.seeds
    old = None if regime[name] in rerun else reusable(prev, c, seeds)
    if old is not None:
      runs[name], timing[name] = old, prev.get("timing", {}).get(name)
      reused.append(name)
      continue
    t0, c0 = time.perf_counter(), time.process_time()
    runs[name] = []
    for seed in range(seeds):
      r = run(c, seed)
      runs[name].append(r)
      shown = {k: round(v, 3) for k, v in r.items() if k in (
          "eval_reward", "entropy_last", "incorrect_len_drift", "maxvio_mean", "lm_loss_last",
          "collapse_step", "seconds") and v is not None}
      print(f"{name} seed {seed}: {shown}", flush=True)
    timing[name] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
  rows = [compare(c, runs) for c in comps]
  collapse = [collapse_row(c, runs[c.name]) for c in col]
  if rows:
    print_table([{"regime": r["regime"], "claim": r["claim"], "metric": r["metric"],
                  "A": r["A"], "A mean [95% CI]": fmt(r["A_mean_ci"]), "B": r["B"],
                  "B mean [95% CI]": fmt(r["B_mean_ci"]),
                  "effect as claimed [95% CI]": fmt(r["effect_ci"]),
                  "collapsed A/B": "/".join(map(str, r.get("collapsed", []))) or "-",
                  "verdict": r["verdict"]} for r in rows])
  for r in rows:
    if "clip_frac_mean" in r:
      print(f"{r['A']} / {r['B']}: clip fraction {r['clip_frac_mean'][0]:.3f} / "
            f"{r['clip_frac_mean'][1]:.3f} of tokens (upper clip {r['clip_frac_high_mean'][0]:.3f}"
            f" / {r['clip_frac_high_mean'][1]:.3f}), held-out accuracy "
            f"{fmt(r['eval_reward'][0])} / {fmt(r['eval_reward'][1])}")
  if collapse:
    print_table([{"run": r["run"], "seeds": r["seeds"], "note fired": r["note_fired"],
                  "rule fired": r["rule_fired"], "onset steps": r["onset_steps"],
                  "reward last [95% CI]": fmt(r["reward_last"]),
                  "entropy last [95% CI]": fmt(r["entropy_last"])} for r in collapse])
  total = {"wall_s": time.perf_counter() - t_all, "cpu_s": time.process_time() - c_all}
  print(f"total: {total['wall_s']:.0f}s wall, {total['cpu_s']:.0f}s cpu", flush=True)
  if reused:
    print(f"reused from {args.merge}: {len(reused)} of {len(cells)} cells", flush=True)
  payload = {"quick": args.quick, "sizes": dataclasses.asdict(s), "regimes": only, "rows": rows,
             "collapse": collapse, "runs": runs, "timing": timing, "total": total,
             "cells": {n: fingerprint(c) for n, c in cells.items()},
             "merged_from": args.merge, "reused": reused}
  write_json(args.out or ("algorithms_quick" if args.quick else "algorithms"), payload)
  return payload


if __name__ == "__main__":
  main()

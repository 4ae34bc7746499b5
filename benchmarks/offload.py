"""Rollout offload on this machine: step time and rollout throughput of the GRPO recipe for

- co-located: rollout on the trainer's own devices (the in-process engine), no Ray;
- offload everything: T_seed = 0, 2 Ray workers do all the rollout (RLBoost's "no seeding");
- adaptive: the trainer seeds for T_seed (feedback controller) then hands off to 2 Ray workers;

the two Ray settings with one worker preempted (SIGKILL, from a trace) mid-run. Medians over
the steps after `--skip` warm-up steps. `--token_delay` slows the Ray workers per token, to
stand for remote instances slower than the trainer's devices.

    python -m benchmarks.offload [--steps=16] [--prompts=32] [--max_new_tokens=32]

Results: benchmarks/results/offload.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks.common import print_table, write_json  # noqa: E402


def _trace(path: str, kill_at_s: float) -> str:
  """A Bamboo-format trace: two nodes from the start, one removed at `kill_at_s`."""
  with open(path, "w", encoding="utf-8") as f:
    f.write(f"0,add,node1\n0,add,node2\n{int(kill_at_s * 1000)},remove,node1\n")
  return path


def run(name: str, args, **rc) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  base = recipe_lib.RecipeConfig(
      steps=args.steps, prompts_per_step=args.prompts, group_size=4,
      micro_batch_groups=args.prompts,
      max_new_tokens=args.max_new_tokens, max_prompt_len=8, sft_steps=0, lr_warmup_steps=0,
      progress=False, worker_token_delay=args.token_delay)
  hist = recipe_lib.run_recipe(recipe_lib.build_recipe(dataclasses.replace(base, **rc)),
                               messages=False).run.history
  rows = hist[args.skip:]
  for i, h in enumerate(hist):
    print(f"  {name} step {i + 1}: step {h['time_step']:.3f}s rollout {h['time_rollout']:.3f}s "
          f"t_seed {h.get('t_seed', 0):.3f} workers {h.get('live_workers', 0)} "
          f"lost {h.get('rollout_lost', 0)} migrated {h.get('rollout_migrated', 0)}")
  med = lambda k: float(statistics.median(h[k] for h in rows)) if rows else float("nan")  # noqa: E731
  tokens = sum(h["response_len_mean"] * args.prompts * 4 for h in rows)
  roll = sum(h["time_rollout"] for h in rows)
  return {"setting": name, "step_s": med("time_step"), "rollout_s": med("time_rollout"),
          "train_s": med("time_train"), "rollout_tok_s": tokens / max(roll, 1e-9),
          "trained_tok_s": tokens / max(sum(h["time_step"] for h in rows), 1e-9),
          "t_seed": med("t_seed") if "t_seed" in rows[0] else 0.0,
          "local_token_frac": float(np.sum([h.get("tokens_local", 0) for h in rows]) / max(
              np.sum([h.get("tokens_local", 0) + h.get("tokens_remote", 0) for h in rows]), 1)),
          "workers_lost": int(sum(h.get("rollout_lost", 0) for h in hist)),
          "reward_last": float(hist[-1]["reward_mean"])}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=16)
  ap.add_argument("--skip", type=int, default=4, help="warm-up steps left out of the medians")
  ap.add_argument("--prompts", type=int, default=32, help="prompts per step (4 samples each)")
  ap.add_argument("--max_new_tokens", type=int, default=32)
  ap.add_argument("--token_delay", type=float, default=0.0, help="Ray workers' s per token")
  ap.add_argument("--kill_at", type=float, default=8.0, help="seconds into a Ray run")
  args = ap.parse_args()
  rows = [run("co-located", args)]
  with tempfile.TemporaryDirectory() as tmp:
    trace = _trace(os.path.join(tmp, "preempt.csv"), args.kill_at)
    ray = dict(rollout="ray", num_workers=2, preempt_trace=trace, trace_time_scale=1.0)
    rows.append(run("offload everything (T_seed=0)", args, offload="0", **ray))
    rows.append(run("adaptive T_seed", args, offload="adaptive", t_seed_init=0.5, **ray))
  print(f"\nGRPO step, {args.prompts} prompts x 4 samples x {args.max_new_tokens} tokens, "
        f"median of steps {args.skip + 1}-{args.steps}; Ray runs lose one of 2 workers at "
        f"{args.kill_at:.0f} s")
  table = print_table(rows)
  gain = rows[1]["step_s"] / rows[2]["step_s"] - 1
  mean_gain = rows[2]["trained_tok_s"] / rows[1]["trained_tok_s"] - 1
  print(f"\nseeding vs no seeding: {gain:+.0%} throughput by median step time, {mean_gain:+.0%} "
        "by mean over the measured steps (RLBoost: dropping seeding costs 19%)")
  write_json("offload", {"rows": rows, "table": table, "seeding_gain_median": gain,
                         "seeding_gain_mean": mean_gain, "args": vars(args)})


if __name__ == "__main__":
  main()

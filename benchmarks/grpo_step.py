"""GRPO step throughput and reward vs wall-clock on the tiny model (CPU).

    python -m benchmarks.grpo_step [--quick]
    python -m benchmarks.grpo_step --peer_workload [--repeats 3]   # see benchmarks/grpo_peer.py

Part 1: tokens/s of full GRPO steps (rollout + train, sync mode, the default recipe), split
into rollout and training time (after compilation).
Part 2: reward vs wall-clock for grpo, mc_grpo (G=2 and G=8) and vcpo in async mode
(max staleness 2, decoupled PPO) on 1-digit addition, all from the same warm-up checkpoint;
final reward on a fixed evaluation set. Writes benchmarks/results/grpo_step.json and
benchmarks/results/grpo_reward_vs_time.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, print_table, write_json  # noqa: E402
from jaxrl_sys.models import init_params  # noqa: E402
from jaxrl_sys.train import recipe as recipe_lib  # noqa: E402
from jaxrl_sys.train.loop.evaluate import evaluate  # noqa: E402
from jaxrl_sys.train.loop.supervised import supervised_warmup  # noqa: E402

BASE = recipe_lib.RecipeConfig(progress=False, sft_steps=60, lr_warmup_steps=5)


def warm_params(rc: recipe_lib.RecipeConfig):
  recipe = recipe_lib.build_recipe(rc)
  rc, mc = recipe.config, recipe.model.config  # the task's defaults filled in
  params = init_params(mc, jax.random.PRNGKey(rc.loop.seed))
  return supervised_warmup(params, mc, recipe.task, recipe.model.tokenizer,
                           steps=rc.warmup.steps, batch_size=rc.warmup.batch_size,
                           learning_rate=rc.warmup.learning_rate, seq_len=rc.loop.seq_len)


def run(rc: recipe_lib.RecipeConfig, params):
  recipe = recipe_lib.build_recipe(rc)
  session = recipe_lib.rollout_session(recipe, warmup=True)
  try:
    loop = recipe_lib.make_loop(recipe, recipe_lib.recipe_mesh(recipe.mesh_spec), session,
                                init_params=lambda: params)
    return recipe, loop.run()
  finally:
    session.close()


def eval_reward(recipe, params) -> float:
  """Mean reward of `params` on 100 fixed problems, 4 samples each."""
  session = recipe_lib.eval_session(recipe)
  try:
    return evaluate(session, params, recipe.task, recipe.model.tokenizer, range(10_000, 10_100),
                    plan=recipe.plan, samples=4, seed=123)
  finally:
    session.close()


def step_throughput(params, steps: int) -> dict:
  """Sync GRPO steps of the default recipe; the first 2 steps (compilation) are dropped."""
  rc = dataclasses.replace(BASE, steps=steps + 2)
  _, result = run(rc, params)
  h = result.history[2:]
  gen = sum(r["response_len_mean"] * rc.prompts_per_step * rc.group_size for r in h)
  t_roll = sum(r["time_rollout"] for r in h)
  t_train = sum(r["time_train"] for r in h)
  t_step = sum(r["time_step"] for r in h)
  trained = sum(r["num_tokens"] for r in h)
  return {"steps": len(h), "prompts_per_step": rc.prompts_per_step, "group_size": rc.group_size,
          "step_s": t_step / len(h), "rollout_s": t_roll / len(h), "train_s": t_train / len(h),
          "other_s": (t_step - t_roll - t_train) / len(h),
          "generated_tokens_per_step": gen / len(h),
          "tokens_per_s": gen / t_step, "rollout_tokens_per_s": gen / t_roll,
          "train_response_tokens_per_s": trained / t_train,
          "mfu_estimate": float(np.mean([r["mfu"] for r in h]))}


def reward_vs_time(params, steps: int) -> list[dict]:
  runs = [("grpo", 8), ("mc_grpo", 2), ("mc_grpo", 8), ("vcpo", 8)]
  recipe = recipe_lib.build_recipe(BASE)
  start = eval_reward(recipe, params)
  print(f"warm-up checkpoint: eval reward {start:.3f}", flush=True)
  out = []
  for algo, g in runs:
    rc = dataclasses.replace(BASE, algo=algo, group_size=g, steps=steps + 2, mode="async",
                             max_staleness=2, prompts_per_step=32, micro_batch_groups=8)
    recipe, result = run(rc, params)
    h = result.history[2:]  # the first two steps compile
    t = np.cumsum([r["time_step"] for r in h])
    final = eval_reward(recipe, result.state.params)
    out.append({"algo": algo, "G": g, "steps": len(h), "wall_s": float(t[-1]),
                "reward_first10": float(np.mean([r["reward_mean"] for r in h[:10]])),
                "reward_last10": float(np.mean([r["reward_mean"] for r in h[-10:]])),
                "eval_reward_start": start, "eval_reward": final,
                "off_policy_token_frac": float(np.mean([r["off_policy_token_frac"] for r in h])),
                "time": t.tolist(), "reward": [r["reward_mean"] for r in h]})
    print(f"{algo} G={g}: {out[-1]['reward_first10']:.3f} -> {out[-1]['reward_last10']:.3f} "
          f"in {t[-1]:.0f}s, eval {final:.3f}", flush=True)
  return out


def plot(curves: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7, 4))
  for c in curves:
    r = np.convolve(c["reward"], np.ones(5) / 5, mode="valid")
    ax.plot(np.asarray(c["time"])[4:], r, label=f"{c['algo']} G={c['G']}")
  ax.set_xlabel("wall-clock (s, after compilation)")
  ax.set_ylabel("train reward (5-step mean)")
  ax.set_title("async (eta=2) on 1-digit addition, tiny model, CPU")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  print(f"wrote {path}")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true", help="few steps (smoke run)")
  ap.add_argument("--peer_workload", action="store_true",
                  help="the TRL / Tunix side-by-side workload on generated HF models, train "
                       "phase against the GEMM roofline (benchmarks/grpo_peer.py)")
  ap.add_argument("--repeats", type=int, default=3, help="--peer_workload: runs per model")
  ap.add_argument("--steps", type=int, default=8, help="--peer_workload: steps per run")
  ap.add_argument("--model_root", default=None,
                  help="--peer_workload: where the generated models live (default: tmp dir)")
  args = ap.parse_args()
  if args.peer_workload:
    from benchmarks import grpo_peer  # pylint: disable=import-outside-toplevel
    grpo_peer.main(args)
    return
  t0 = time.monotonic()
  params = warm_params(BASE)
  thr = step_throughput(params, 3 if args.quick else 10)
  print_table([{k: v for k, v in thr.items()}])
  curves = reward_vs_time(params, 8 if args.quick else 100)
  print_table([{k: v for k, v in c.items() if k not in ("time", "reward")} for c in curves])
  os.makedirs(RESULTS_DIR, exist_ok=True)
  suffix = "_quick" if args.quick else ""
  plot(curves, os.path.join(RESULTS_DIR, f"grpo_reward_vs_time{suffix}.png"))
  write_json(f"grpo_step{suffix}", {"step_throughput": thr, "reward_vs_time": curves,
                                    "total_s": time.monotonic() - t0})


if __name__ == "__main__":
  main()

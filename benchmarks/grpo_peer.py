"""The TRL / Tunix side-by-side GRPO workload on our trainer, with the train phase against the
GEMM roofline of this machine (`python -m benchmarks.grpo_step --peer_workload`).

Workload (as in `benchmarks.peers.compare`): the tiny Qwen2 and Qwen3-MoE models of `peer_models`, 8
prompts "a+b=" (a, b < 100) x G=8, exactly 32 new tokens (no stop token), KL 0.04 with a
reference forward, AdamW lr 1e-5 without warm-up, one update per batch, float32, the recipe's
defaults otherwise. Per run: medians over steps 3..steps of step / rollout / train time (the
loop's own split: train = scoring, packing, gradient, update). Runs alternate dense / MoE.

Train-phase GFLOP/s = (6 N_active + attention) per trained position for the policy's forward
and backward plus (2 N_active + attention) for the reference forward, the unembedding counted
on the scored response positions only (`metrics_log.train_flops_per_token`), times the
positions computed (rows x seq_len), over the train time. Roofline: the GEMM rate torch
reaches on this CPU for the model's own forward GEMMs at the step's token count (q, k, v, o,
MLP or one expert, unembedding; FLOP-weighted), as `benchmarks.generate` measures it for
decoding; XLA's rate on the same GEMMs is shown beside it.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peer_models
from benchmarks.common import print_table, write_json
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.loop.metrics_log import train_flops_per_token

WORKLOAD = dict(task="arithmetic", task_args="num_digits=2,ops=+", group_size=8,
                prompts_per_step=8, max_new_tokens=32, max_prompt_len=8, sft_steps=0,
                kl_coef=0.04, learning_rate=1e-5, lr_warmup_steps=0, progress=False,
                chat_template=False)  # the peers feed the raw "a+b=" text


def gemm_shapes(mc, tokens: int) -> list[tuple[int, int, int]]:
  """`(m, k, n)` of the model's forward GEMMs for `tokens` positions (one expert's MLP for MoE,
  run on tokens * k / E rows)."""
  d = mc.hidden_size
  out = [(tokens, d, mc.num_heads * mc.head_dim), (tokens, d, mc.num_kv_heads * mc.head_dim),
         (tokens, mc.num_heads * mc.head_dim, d), (tokens, d, mc.vocab_size)]
  if mc.moe is None:
    out += [(tokens, d, mc.intermediate_size), (tokens, mc.intermediate_size, d)]
  else:
    rows = tokens * mc.moe.num_experts_per_tok // mc.moe.num_experts
    f = mc.moe.expert_intermediate_size
    out += [(rows, d, f), (rows, f, d)]
  return out


def _rate(fn, shapes, repeats: int = 5) -> float:
  """FLOP-weighted GEMM rate (FLOP/s) of `fn(a, b)` over `shapes`, best of `repeats`."""
  total_flops = total_s = 0.0
  for m, k, n in shapes:
    a, b = np.random.default_rng(0).standard_normal((2, max(m, k), max(k, n)), np.float32)
    a, b = a[:m, :k].copy(), b[:k, :n].copy()
    reps = max(1, int(2e8 // (2 * m * k * n)))
    fn(a, b)
    best = float("inf")
    for _ in range(repeats):
      t0 = time.perf_counter()
      for _ in range(reps):
        fn(a, b)
      best = min(best, (time.perf_counter() - t0) / reps)
    total_flops += 2 * m * k * n
    total_s += best
  return total_flops / total_s


def roofline(mc, tokens: int) -> dict:
  """torch's and XLA's GEMM rates (GFLOP/s) on the model's GEMMs at `tokens` positions."""
  import torch  # pylint: disable=import-outside-toplevel
  shapes = gemm_shapes(mc, tokens)
  torch_rate = _rate(lambda a, b: torch.from_numpy(a) @ torch.from_numpy(b), [
      s for s in shapes])
  dot = jax.jit(jnp.dot)
  dev = lambda x: jax.device_put(x)  # noqa: E731
  xla_rate = _rate(lambda a, b: dot(dev(a), dev(b)).block_until_ready(), shapes)
  return {"torch_gemm_gflops": torch_rate / 1e9, "xla_gemm_gflops": xla_rate / 1e9,
          "torch_threads": torch.get_num_threads()}


def run_once(model_dir: str, steps: int) -> dict:
  """One process-fresh-state run of the workload; medians over steps 3..steps."""
  rc = recipe_lib.RecipeConfig(model=model_dir, steps=steps, **WORKLOAD)
  recipe = recipe_lib.build_recipe(rc)
  mc, lc = recipe.model.config, recipe.loop
  samples = lc.group_size
  # no stop tokens: every response is max_new_tokens long, as the peers' workload is
  engine = dataclasses.replace(recipe.plan.engine, sampling=dataclasses.replace(
      recipe.plan.engine.sampling, stop_tokens=()))
  recipe = dataclasses.replace(recipe, plan=dataclasses.replace(recipe.plan, engine=engine))
  session = recipe_lib.rollout_session(recipe)
  try:
    loop = recipe_lib.make_loop(recipe, recipe_lib.recipe_mesh(recipe.mesh_spec), session,
                                init_params=lambda: recipe.model.params)
    h = loop.run().history[2:]
  finally:
    session.close()
  med = lambda k: statistics.median(r[k] for r in h)  # noqa: E731
  rows = lc.prompts_per_step * samples
  positions = int(med("train_positions"))      # rows x the packed row length (batch.row_length)
  seq = positions / rows
  flops = train_flops_per_token(mc, seq, reference=recipe.train.uses_reference,
                                scored_len=lc.max_new_tokens) * positions
  return {"step_s": med("time_step"), "rollout_s": med("time_rollout"),
          "train_s": med("time_train"), "response_len": med("response_len_mean"),
          "train_gflop": flops / 1e9, "train_gflops": flops / med("time_train") / 1e9,
          "positions": positions, "config": mc}


def main(args) -> dict:
  root = args.model_root or os.path.join(tempfile.gettempdir(), "jaxrl_sys_peer_models")
  dirs = peer_models.ensure_models(root)
  runs = {"dense": [], "moe": []}
  for _ in range(args.repeats):
    for kind in ("dense", "moe"):
      runs[kind].append(run_once(dirs[kind], args.steps))
  rows, out = [], {"workload": WORKLOAD, "steps": args.steps, "repeats": args.repeats}
  for kind, rs in runs.items():
    mc = rs[0]["config"]
    roof = roofline(mc, rs[0]["positions"])
    med = {k: statistics.median(r[k] for r in rs)
           for k in ("step_s", "rollout_s", "train_s", "train_gflops", "response_len")}
    row = {"model": kind, **med, "train_gflop": rs[0]["train_gflop"], **roof,
           "train_frac_of_torch_gemm": med["train_gflops"] / roof["torch_gemm_gflops"]}
    rows.append(row)
    out[kind] = dict(row, runs=[{k: v for k, v in r.items() if k != "config"} for r in rs])
  dense, moe = out["dense"], out["moe"]
  out["moe_vs_dense_time_per_active_flop"] = dense["train_gflops"] / moe["train_gflops"]
  print_table(rows, ["model", "step_s", "rollout_s", "train_s", "train_gflop", "train_gflops",
                     "torch_gemm_gflops", "xla_gemm_gflops", "train_frac_of_torch_gemm",
                     "response_len"])
  print(f"MoE train time per active FLOP / dense: {out['moe_vs_dense_time_per_active_flop']:.2f}")
  write_json("grpo_step_peer", out)
  return out

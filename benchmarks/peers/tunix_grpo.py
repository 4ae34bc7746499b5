#!/usr/bin/env python
"""N GRPO steps of Google Tunix's `GRPOLearner` (JAX) on CPU (run in the Tunix venv that
`benchmarks.peers.compare` installs; imports nothing of jaxrl_sys).

    python benchmarks/peers/tunix_grpo.py --model DIR [--steps 8] [--warmup-steps 2]
        [--prompts-per-step 8] [--num-generations 8] [--max-completion-length 32]
        [--beta 0.04] [--seed 0]

DIR is a `make_tiny_model.py` directory (qwen2, qwen3 or qwen3_moe): its safetensors load into
Tunix's own model code (`tunix.models.qwen2` / `qwen3`, `create_model_from_safe_tensors`) and its
tokenizer through Tunix's Hugging Face adapter, so TRL, Tunix and jaxrl_sys start from the same
weights and token ids.

The workload is `trl_grpo.py`'s: "a+b=" prompts, the same reward, 8 prompts x G=8 per step,
temperature 1, 32 new tokens (the eos id is outside the vocabulary, so no completion stops
early), Tunix's GRPO loss (sequence-mean-token-mean, epsilon 0.2) with beta 0.04, one
iteration, AdamW lr 1e-5 with global-norm clipping 1, float32, the vanilla JAX rollout on one
CPU device.

Timed per step, by wrapping Tunix internals: `gen_s` (`RLCluster.generate`, tokenizing
included), `rollout_s` (`_generate_and_compute_advantage`), `train_s` (step - rollout),
`step_s` (`_run_global_step`). Steps 1-2 compile; the medians leave out --warmup-steps.
"""

import argparse
import json
import os
import random
import re
import resource
import statistics
import time


def peak_rss_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


_INT_RE = re.compile(r"\s*(-?\d+)")


def arithmetic_reward(prompts, completions, answer, **kwargs):
  out = []
  for c, a in zip(completions, answer):
    m = _INT_RE.match(c)
    if m is None:
      out.append(0.0)
    elif m.group(1) == a:
      out.append(1.0)
    else:
      out.append(0.1)
  return out


def make_batches(n_batches, batch, seed):
  import numpy as np

  rng = random.Random(seed)
  batches = []
  for _ in range(n_batches):
    prompts, answers = [], []
    for _ in range(batch):
      a, b = rng.randint(0, 99), rng.randint(0, 99)
      prompts.append(f"{a}+{b}=")
      answers.append(str(a + b))
    # numpy arrays, as grain's .batch() would give: Tunix repeats each field with
    # jax.tree.map(np.repeat, ...), which would treat a python list as a pytree of leaves.
    batches.append({"prompts": np.array(prompts), "answer": np.array(answers)})
  return batches


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", required=True)
  ap.add_argument("--steps", type=int, default=8)
  ap.add_argument(
    "--warmup-steps", type=int, default=2, help="leading steps excluded from the medians"
  )
  ap.add_argument("--prompts-per-step", type=int, default=8)
  ap.add_argument("--num-generations", type=int, default=8)
  ap.add_argument("--max-completion-length", type=int, default=32)
  ap.add_argument("--max-prompt-length", type=int, default=16)
  ap.add_argument("--beta", type=float, default=0.04)
  ap.add_argument("--lr", type=float, default=1e-5)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--json-out", default=None)
  args = ap.parse_args()

  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  t_import = time.perf_counter()
  import jax
  import numpy as np
  import optax
  import transformers
  from importlib.metadata import version as pkg_version
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner as grpo_lib
  from tunix.rl.rollout import base_rollout

  import_s = time.perf_counter() - t_import

  with open(os.path.join(args.model, "config.json")) as f:
    hf = json.load(f)
  mtype = hf["model_type"]
  if mtype == "qwen2":
    from tunix.models.qwen2 import model as tmodel
    from tunix.models.qwen2 import params as tparams
  elif mtype in ("qwen3", "qwen3_moe"):
    from tunix.models.qwen3 import model as tmodel
    from tunix.models.qwen3 import params as tparams
  else:
    raise SystemExit(f"unsupported model_type={mtype} (qwen2, qwen3, qwen3_moe)")
  rope = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
  kw = dict(
    num_layers=hf["num_hidden_layers"],
    vocab_size=hf["vocab_size"],
    embed_dim=hf["hidden_size"],
    hidden_dim=hf["intermediate_size"],
    num_heads=hf["num_attention_heads"],
    head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
    num_kv_heads=hf["num_key_value_heads"],
    rope_theta=int(rope),
    norm_eps=hf["rms_norm_eps"],
    use_tied_embedding=hf.get("tie_word_embeddings", False),
  )
  if mtype == "qwen3_moe":
    kw.update(
      hidden_dim=hf["moe_intermediate_size"],
      num_experts=hf.get("num_experts", hf.get("num_local_experts")),
      num_experts_per_tok=hf["num_experts_per_tok"],
    )
  cfg = tmodel.ModelConfig(**kw)

  # Auto axis types: with jax.make_mesh's default (Explicit) axes, Tunix's Qwen2 embedding gather
  # fails with "ShardingTypeError: Use `.at[...].get(out_sharding=)` ..." on jax 0.10.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
  t0 = time.perf_counter()
  actor = tparams.create_model_from_safe_tensors(args.model, cfg, mesh)
  reference = tparams.create_model_from_safe_tensors(args.model, cfg, mesh) if args.beta else None
  load_s = time.perf_counter() - t0
  tok = transformers.AutoTokenizer.from_pretrained(args.model)
  tok.padding_side = "left"

  n_seq = args.prompts_per_step * args.num_generations
  optimizer = optax.chain(
    optax.clip_by_global_norm(1.0), optax.adamw(args.lr, b1=0.9, b2=0.999, weight_decay=0.0)
  )
  cluster_config = rl_cluster_lib.ClusterConfig(
    role_to_mesh={
      rl_cluster_lib.Role.ACTOR: mesh,
      rl_cluster_lib.Role.REFERENCE: mesh,
      rl_cluster_lib.Role.ROLLOUT: mesh,
    },
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optimizer,
      eval_every_n_steps=10**9,
      max_steps=args.steps,
      mini_batch_size=args.prompts_per_step,
      train_micro_batch_size=args.prompts_per_step,
    ),
    rollout_config=base_rollout.RolloutConfig(
      max_tokens_to_generate=args.max_completion_length,
      max_prompt_length=args.max_prompt_length,
      kv_cache_size=args.max_prompt_length + args.max_completion_length + 16,
      temperature=1.0,
      top_p=1.0,
      top_k=None,
      # int seed (a PRNGKey array here gets donated by the jitted prefill and fails on step 2:
      # "RuntimeError: Array has been deleted with shape=uint32[2]"); the sampler re-keys it on
      # each call.
      seed=args.seed,
      eos_tokens=[cfg.vocab_size],  # never sampled -> fixed-length completions
    ),
  )
  rl_cluster = rl_cluster_lib.RLCluster(
    actor=actor,
    reference=reference,
    tokenizer=tok,
    cluster_config=cluster_config,
  )
  algo = grpo_lib.GRPOConfig(
    num_generations=args.num_generations,
    num_iterations=1,
    beta=args.beta,
    epsilon=0.2,
  )
  learner = grpo_lib.GRPOLearner(
    rl_cluster=rl_cluster,
    algo_config=algo,
    reward_fns=arithmetic_reward,
    data_shuffle_seed=args.seed,
  )

  # ---- timing hooks --------------------------------------------------------------------------
  bench = {"gen_s": 0.0, "gen_tokens": 0, "gen_seqs": 0, "rollout_s": 0.0}
  records = []
  orig_generate = rl_cluster.generate

  def timed_generate(*a, **k):
    t = time.perf_counter()
    out = orig_generate(*a, **k)
    jax.block_until_ready(out.tokens)
    bench["gen_s"] += time.perf_counter() - t
    bench["gen_tokens"] += int(sum(len(x) for x in out.tokens))
    bench["gen_seqs"] += len(out.tokens)
    return out

  rl_cluster.generate = timed_generate
  orig_adv = learner._generate_and_compute_advantage

  def timed_adv(*a, **k):
    t = time.perf_counter()
    out = orig_adv(*a, **k)
    jax.block_until_ready(jax.tree.leaves(out))
    bench["rollout_s"] += time.perf_counter() - t
    return out

  learner._generate_and_compute_advantage = timed_adv
  orig_step = learner._run_global_step

  def timed_step(*a, **k):
    for key in bench:
      bench[key] = 0 if key in ("gen_tokens", "gen_seqs") else 0.0
    t = time.perf_counter()
    out = orig_step(*a, **k)
    jax.block_until_ready(jax.tree.leaves(rl_cluster.actor_trainer.model))
    step_s = time.perf_counter() - t
    b = dict(bench)
    records.append(
      {
        "step": len(records) + 1,
        "step_s": step_s,
        "gen_s": b["gen_s"],
        "rollout_s": b["rollout_s"],
        "train_s": step_s - b["rollout_s"],
        "gen_tokens": b["gen_tokens"],
        "gen_seqs": b["gen_seqs"],
        "gen_tok_per_s": b["gen_tokens"] / b["gen_s"] if b["gen_s"] else float("nan"),
        "rss_mb": peak_rss_mb(),
      }
    )
    return out

  learner._run_global_step = timed_step
  # ---------------------------------------------------------------------------------------------

  train_ds = make_batches(args.steps + 2, args.prompts_per_step, args.seed)
  t_start = time.perf_counter()
  learner.train(train_ds)
  total = time.perf_counter() - t_start

  for r in records:
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}))
  steady = records[args.warmup_steps :] if len(records) > args.warmup_steps else records
  med = lambda key: statistics.median(r[key] for r in steady)  # noqa: E731
  n_params = sum(
    x.size
    for x in jax.tree.leaves(__import__("flax").nnx.state(actor, __import__("flax").nnx.Param))
  )
  summary = {
    "framework": "tunix",
    "google-tunix": pkg_version("google-tunix"),
    "jax": jax.__version__,
    "flax": pkg_version("flax"),
    "devices": str(jax.devices()),
    "model": os.path.basename(args.model.rstrip("/")),
    "params": int(n_params),
    "steps": len(records),
    "warmup_steps_excluded": args.warmup_steps,
    "prompts_per_step": args.prompts_per_step,
    "G": args.num_generations,
    "seqs_per_step": n_seq,
    "max_completion_length": args.max_completion_length,
    "beta": args.beta,
    "median_step_s": round(med("step_s"), 4),
    "median_gen_s": round(med("gen_s"), 4),
    "median_gen_tok_per_s": round(med("gen_tok_per_s"), 1),
    "median_rollout_s": round(med("rollout_s"), 4),
    "median_train_s": round(med("train_s"), 4),
    "first_step_s(incl_jit)": round(records[0]["step_s"], 4) if records else None,
    "import_s": round(import_s, 2),
    "load_s": round(load_s, 2),
    "total_train_wall_s": round(total, 2),
    "peak_rss_mb": round(peak_rss_mb(), 1),
  }
  print("SUMMARY " + json.dumps(summary))
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump({"summary": summary, "steps": records}, f, indent=1)


if __name__ == "__main__":
  main()

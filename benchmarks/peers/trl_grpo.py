#!/usr/bin/env python
"""N GRPO steps of Hugging Face TRL's `GRPOTrainer` on CPU (run in the TRL venv that
`benchmarks.peers.compare` installs; imports nothing of jaxrl_sys).

    python benchmarks/peers/trl_grpo.py --model DIR [--steps 8] [--warmup-steps 2]
        [--prompts-per-step 8] [--num-generations 8] [--max-completion-length 32]
        [--beta 0.04] [--loss-type grpo] [--seed 0]

The workload is the one `tunix_grpo.py` and our CLI run: "a+b=" prompts (a, b in [0, 99],
seeded); reward 1 for the right integer first, 0.1 for any integer first, else 0; each step
8 prompts x G=8 completions sampled at temperature 1 (no top-k / top-p), eos suppressed so every
completion is exactly 32 tokens (`min_new_tokens`); one AdamW step per batch; loss "grpo"
(per-sequence token mean, then the batch mean) with beta 0.04 (a reference forward each step);
float32, no vLLM.

Timed per step, by wrapping TRL's own methods: `gen_s` (inside `generate`: gen_tok_per_s =
completion tokens / gen_s), `rollout_s` (`_generate_and_score_completions`: generation, decode,
reward, reference log-probs, advantages), `train_s` (step - rollout), `step_s` (callback begin
to end). Prints one JSON line per step and `SUMMARY {...}` with medians after --warmup-steps.
"""

import argparse
import json
import os
import random
import re
import resource
import statistics
import tempfile
import time


def peak_rss_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_prompts(n, seed):
  rng = random.Random(seed)
  rows = {"prompt": [], "answer": []}
  for _ in range(n):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    rows["prompt"].append(f"{a}+{b}=")
    rows["answer"].append(str(a + b))
  return rows


_INT_RE = re.compile(r"\s*(-?\d+)")


def arithmetic_reward(prompts=None, completions=None, answer=None, **kwargs):
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
  ap.add_argument("--beta", type=float, default=0.04)
  ap.add_argument("--loss-type", default="grpo")
  ap.add_argument("--lr", type=float, default=1e-5)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument(
    "--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
  )
  ap.add_argument(
    "--no-fixed-length", action="store_true", help="allow early EOS (variable lengths)"
  )
  ap.add_argument("--json-out", default=None)
  ap.add_argument(
    "--gradient-checkpointing",
    action="store_true",
    help="TRL 1.x defaults to True; off here (nothing to save on a tiny model; A/B on this "
    "machine: no difference beyond noise)",
  )
  args = ap.parse_args()

  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("WANDB_DISABLED", "true")
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  import torch
  import transformers
  import trl
  from datasets import Dataset
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  torch.set_num_threads(args.threads)
  transformers.set_seed(args.seed)

  tok = AutoTokenizer.from_pretrained(args.model)
  tok.padding_side = "left"
  model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
  n_seq = args.prompts_per_step * args.num_generations
  ds = Dataset.from_dict(make_prompts(max(512, args.steps * args.prompts_per_step), args.seed))

  gen_kwargs = {"top_k": 0, "top_p": 1.0}
  if not args.no_fixed_length:
    gen_kwargs["min_new_tokens"] = args.max_completion_length

  out_dir = tempfile.mkdtemp(prefix="trl-grpo-bench-")
  cfg = GRPOConfig(
    output_dir=out_dir,
    max_steps=args.steps,
    per_device_train_batch_size=n_seq,
    gradient_accumulation_steps=1,
    num_generations=args.num_generations,
    max_completion_length=args.max_completion_length,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    generation_kwargs=gen_kwargs,
    beta=args.beta,
    loss_type=args.loss_type,
    num_iterations=1,
    learning_rate=args.lr,
    lr_scheduler_type="constant",
    warmup_steps=0,
    max_grad_norm=1.0,
    use_vllm=False,
    gradient_checkpointing=args.gradient_checkpointing,
    bf16=False,
    fp16=False,
    use_cpu=True,
    report_to="none",
    logging_steps=1,
    save_strategy="no",
    seed=args.seed,
    data_seed=args.seed,
    dataloader_num_workers=0,
    disable_tqdm=True,
    log_completions=False,
  )

  class TimedGRPOTrainer(GRPOTrainer):
    def __init__(self, *a, **k):
      super().__init__(*a, **k)
      self.bench = {"gen_s": 0.0, "gen_tokens": 0, "gen_seqs": 0, "rollout_s": 0.0}

    def _generate_single_turn(self, prompt_ids, *a, **k):
      t0 = time.perf_counter()
      completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *a, **k)
      self.bench["gen_s"] += time.perf_counter() - t0
      self.bench["gen_tokens"] += sum(len(c) for c in completion_ids)
      self.bench["gen_seqs"] += len(completion_ids)
      return completion_ids, logprobs

    def _generate_and_score_completions(self, *a, **k):
      t0 = time.perf_counter()
      out = super()._generate_and_score_completions(*a, **k)
      self.bench["rollout_s"] += time.perf_counter() - t0
      return out

  records = []

  class StepTimer(TrainerCallback):
    def __init__(self):
      self.trainer = None
      self.t0 = None
      self.last_log = {}

    def on_step_begin(self, a, state, control, **kw):
      for key in self.trainer.bench:
        self.trainer.bench[key] = 0 if key.endswith(("tokens", "seqs")) else 0.0
      self.t0 = time.perf_counter()

    def on_step_end(self, a, state, control, **kw):
      step_s = time.perf_counter() - self.t0
      b = dict(self.trainer.bench)
      rec = {
        "step": state.global_step,
        "step_s": step_s,
        "gen_s": b["gen_s"],
        "rollout_s": b["rollout_s"],
        "train_s": step_s - b["rollout_s"],
        "gen_tokens": b["gen_tokens"],
        "gen_seqs": b["gen_seqs"],
        "gen_tok_per_s": b["gen_tokens"] / b["gen_s"] if b["gen_s"] > 0 else float("nan"),
        "rss_mb": peak_rss_mb(),
      }
      records.append(rec)

    def on_log(self, a, state, control, logs=None, **kw):
      if logs and records:
        for k in ("reward", "loss", "kl", "completions/mean_length"):
          if k in logs:
            records[-1][k] = logs[k]

  timer = StepTimer()
  trainer = TimedGRPOTrainer(
    model=model,
    reward_funcs=arithmetic_reward,
    args=cfg,
    train_dataset=ds,
    processing_class=tok,
    callbacks=[timer],
  )
  timer.trainer = trainer

  t_start = time.perf_counter()
  trainer.train()
  total = time.perf_counter() - t_start

  for r in records:
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}))
  steady = records[args.warmup_steps :] if len(records) > args.warmup_steps else records
  med = lambda key: statistics.median(r[key] for r in steady)  # noqa: E731
  summary = {
    "framework": "trl",
    "trl": trl.__version__,
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "threads": torch.get_num_threads(),
    "model": os.path.basename(args.model.rstrip("/")),
    "params": sum(p.numel() for p in model.parameters()),
    "steps": len(records),
    "warmup_steps_excluded": args.warmup_steps,
    "prompts_per_step": args.prompts_per_step,
    "G": args.num_generations,
    "seqs_per_step": n_seq,
    "max_completion_length": args.max_completion_length,
    "beta": args.beta,
    "loss_type": args.loss_type,
    "median_step_s": round(med("step_s"), 4),
    "median_gen_s": round(med("gen_s"), 4),
    "median_gen_tok_per_s": round(med("gen_tok_per_s"), 1),
    "median_rollout_s": round(med("rollout_s"), 4),
    "median_train_s": round(med("train_s"), 4),
    "first_step_s": round(records[0]["step_s"], 4),
    "total_train_wall_s": round(total, 2),
    "peak_rss_mb": round(peak_rss_mb(), 1),
  }
  print("SUMMARY " + json.dumps(summary))
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump({"summary": summary, "steps": records}, f, indent=1)


if __name__ == "__main__":
  main()

"""Rollout engine throughput on a GRPO-shaped, long-tailed load (CPU).

Load: P prompts x G samples (same prompt and group id), prompt lengths uniform in [16, 64],
per-request budgets (max_new_tokens) drawn from a clipped log-normal: most responses are short,
a few are very long, as when a stop-token distribution has a long tail. Random-weight tiny
Qwen2 (hidden 256, 4 layers, vocab 2048), temperature 1.0, no stop tokens (responses end at
their budget).

Compared, counting only the useful tokens (each request's budget):
- engine: `rollout.Engine` (continuous batching, shared-prompt prefill), all requests at once;
- static: `models.generate` over fixed batches of `static_batch` consecutive requests, each
  batch decoding until its longest budget (what a static batch pays for a long tail);
- transformers: `generate` on the same weights (exported with `save_hf_checkpoint`), same
  static batches, all measured by default. `--hf-batches N` / `--hf-steps S` measure only the
  first N batches for at most S steps each and extrapolate the full-load time from the time
  per batch step, which flatters transformers (later steps attend over longer contexts and
  cost more): on the default load one batch x 128 steps extrapolates to 36 s where the full
  run takes 45 s.

"Tail" is the time from 90% of responses completed to the last one (0 for static batches when
the last batch holds more than 10% of the responses: their whole run is tail-bound);
"useful" is useful tokens / decoded row-steps (padding and idle slots waste the rest).
Compilation is excluded from the timings and reported separately.

Run: `python -m benchmarks.rollout_engine [--quick]`; writes benchmarks/results/rollout_engine.json
(rollout_engine_quick.json with --quick).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import time

import numpy as np

import jax

from jaxrl_sys import models
from jaxrl_sys.rollout import Engine, EngineConfig, Request, request_key

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "rollout_engine.json"
MODEL = models.ModelConfig(vocab_size=2048, hidden_size=256, num_layers=4, num_heads=4,
                           num_kv_heads=2, head_dim=64, intermediate_size=512, max_seq_len=2048,
                           attention_bias=True, rope=models.RopeConfig(theta=1e6))
SAMPLING = models.SamplingConfig(temperature=1.0)


def make_load(prompts: int, group: int, median: float, cap: int, seed: int = 0):
  """GRPO-shaped requests with long-tailed budgets (log-normal, sigma 1, clipped)."""
  rng = np.random.default_rng(seed)
  reqs = []
  for p in range(prompts):
    prompt = rng.integers(3, MODEL.vocab_size, size=int(rng.integers(16, 65)))
    for g in range(group):
      rid = p * group + g
      budget = int(np.clip(rng.lognormal(np.log(median), 1.0), 4, cap))
      reqs.append(Request(rid, prompt, budget, request_key(seed, rid), group_id=p))
  return reqs


def _summary(name, t_total, done_times, tokens, compile_s, **extra):
  done = np.sort(np.asarray(done_times))
  t90 = float(done[int(np.ceil(0.9 * len(done))) - 1])
  out = dict(method=name, time_s=t_total, tokens=int(tokens), tokens_per_s=tokens / t_total,
             t90_s=t90, tail_s=t_total - t90, tail_frac=(t_total - t90) / t_total,
             compile_s=compile_s, **extra)
  out["useful_frac"] = tokens / extra["row_steps"]  # useful tokens / decoded rows x steps
  return out


def run_engine(params, reqs, slots: int, stream_every: int, max_len: int):
  cfg = EngineConfig(num_slots=slots, max_len=max_len, prefill_buckets=(32, 64),
                     prefill_batch_buckets=(1, 8), stream_every=stream_every, sampling=SAMPLING)
  eng = Engine(MODEL, params, cfg)
  t0 = time.perf_counter()
  eng.warmup()
  compile_s = time.perf_counter() - t0
  done_at = {}
  t0 = time.perf_counter()
  eng.submit(reqs)
  while eng.has_work():
    for ch in eng.step():
      if ch.finish is not None:
        done_at[ch.request_id] = time.perf_counter() - t0
  total = time.perf_counter() - t0
  comps = eng.take_completions()
  tokens = sum(c.request.num_generated for c in comps)
  assert len(comps) == len(reqs) and tokens == sum(r.max_new_tokens for r in reqs)
  return _summary("engine", total, list(done_at.values()), tokens, compile_s,
                  row_steps=eng.stats.decode_row_steps, stats=eng.stats.as_dict(),
                  num_slots=slots, stream_every=stream_every,
                  max_len=max_len), {c.request_id: c.request for c in comps}


def _batches(reqs, size):
  for i in range(0, len(reqs), size):
    part = reqs[i:i + size]
    width = max(len(r.prompt) for r in part)
    toks = np.zeros((len(part), width), np.int32)
    mask = np.zeros((len(part), width), np.int32)
    for j, r in enumerate(part):
      toks[j, width - len(r.prompt):], mask[j, width - len(r.prompt):] = r.prompt, 1
    yield part, toks, mask, max(r.max_new_tokens for r in part)


def run_static(params, reqs, batch: int):
  """models.generate over fixed batches, each decoding to its longest budget."""
  compiled, compile_s = [], 0.0
  for part, toks, mask, steps in _batches(reqs, batch):
    s = models.SamplingConfig(temperature=SAMPLING.temperature, max_new_tokens=steps)
    fn = jax.jit(lambda p, t, m, k, s=s: models.generate(p, MODEL, t, m, keys=k, sampling=s))
    keys = np.stack([r.key for r in part])
    t0 = time.perf_counter()
    compiled.append((fn.lower(params, toks, mask, keys).compile(), part, toks, mask, keys))
    compile_s += time.perf_counter() - t0
  done, tokens, outs = [], 0, {}
  row_steps = sum(len(part) * max(r.max_new_tokens for r in part) for _, part, *_ in compiled)
  t0 = time.perf_counter()
  for fn, part, toks, mask, keys in compiled:
    out = jax.block_until_ready(fn(params, toks, mask, keys))
    now = time.perf_counter() - t0
    out_t = np.asarray(out.tokens)
    for j, r in enumerate(part):
      outs[r.request_id] = out_t[j, :r.max_new_tokens]
      tokens += r.max_new_tokens
      done.append(now)
  total = time.perf_counter() - t0
  return _summary("static_generate", total, done, tokens, compile_s, batch=batch,
                  row_steps=row_steps), outs


def run_transformers(params, reqs, batch: int, num_batches: int, max_steps: int):
  """transformers.generate on the first `num_batches` static batches (0 = all) for at most
  `max_steps` steps each (0 = all); when that is not the whole load, its time is extrapolated
  from the time per batch step."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as d:
    models.save_hf_checkpoint(d, MODEL, params)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
  all_batches = list(_batches(reqs, batch))
  num_batches = num_batches or len(all_batches)
  max_steps = max_steps or 1 << 30
  t_used, steps_used, tokens = 0.0, 0, 0
  for part, toks, mask, steps in all_batches[:num_batches]:
    steps = min(steps, max_steps)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.no_grad():
      out = model.generate(input_ids=torch.tensor(toks, dtype=torch.long),
                           attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=steps,
                           min_new_tokens=steps, pad_token_id=0, eos_token_id=None)
    t_used += time.perf_counter() - t0
    assert out.shape[1] == toks.shape[1] + steps
    steps_used += steps
    tokens += sum(min(r.max_new_tokens, steps) for r in part)
  per_step = t_used / steps_used
  full_steps = sum(steps for *_, steps in all_batches)
  full_tokens = sum(r.max_new_tokens for r in reqs)
  extrapolated = steps_used < full_steps
  est = per_step * full_steps if extrapolated else t_used
  return dict(method="transformers_generate", measured_batches=num_batches,
              useful_frac=full_tokens / sum(len(p) * st for p, _, _, st in all_batches),
              measured_time_s=t_used, measured_tokens=tokens,
              measured_tokens_per_s=tokens / t_used, time_s=est, tokens=full_tokens,
              tokens_per_s=full_tokens / est, batch=batch, extrapolated=extrapolated,
              torch_threads=torch.get_num_threads())


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="small load (about a minute)")
  ap.add_argument("--prompts", type=int, default=None)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--slots", type=int, default=64)
  ap.add_argument("--stream-every", type=int, default=8)
  ap.add_argument("--hf-batches", type=int, default=0, help="0 = all static batches")
  ap.add_argument("--hf-steps", type=int, default=0, help="0 = every step of a batch")
  ap.add_argument("--out", default=None, help=f"default {RESULTS} (_quick.json with --quick)")
  args = ap.parse_args(argv)
  prompts = args.prompts or (16 if args.quick else 64)
  median, cap = (24, 192) if args.quick else (32, 320)
  reqs = make_load(prompts, args.group, median, cap)
  budgets = np.array([r.max_new_tokens for r in reqs])
  params = models.init_params(MODEL, jax.random.PRNGKey(0))
  max_len = 64 + cap
  static_batch = 8 * args.group  # 8 prompts' groups per static batch
  print(f"load: {prompts} prompts x G={args.group} = {len(reqs)} requests, budgets p50/p90/max "
        f"{np.median(budgets):.0f}/{np.percentile(budgets, 90):.0f}/{budgets.max()}, "
        f"{budgets.sum()} tokens; devices {jax.devices()[0].platform} x{jax.device_count()}")

  eng, eng_out = run_engine(params, reqs, args.slots, args.stream_every, max_len)
  print(f"engine done in {eng['time_s']:.1f}s")
  static, static_out = run_static(params, reqs, static_batch)
  print(f"static done in {static['time_s']:.1f}s")
  same = sum(np.array_equal(eng_out[r.request_id].tokens, static_out[r.request_id]) for r in reqs)
  hf = run_transformers(params, reqs, static_batch, args.hf_batches, args.hf_steps)
  print(f"transformers measured {hf['measured_time_s']:.1f}s on {args.hf_batches} batch(es)")

  rows = [eng, static, hf]
  print(f"\n{'method':<24}{'time s':>9}{'tok/s':>10}{'t90 s':>9}{'tail s':>9}{'tail %':>8}"
        f"{'useful %':>10}{'compile s':>11}")
  for r in rows:
    t90 = r.get("t90_s", float("nan"))
    tail = r.get("tail_s", float("nan"))
    frac = 100 * r.get("tail_frac", float("nan"))
    print(f"{r['method']:<24}{r['time_s']:>9.1f}{r['tokens_per_s']:>10.0f}{t90:>9.1f}{tail:>9.1f}"
          f"{frac:>8.1f}{100 * r['useful_frac']:>10.1f}{r.get('compile_s', float('nan')):>11.1f}")
  speed_static = eng["tokens_per_s"] / static["tokens_per_s"]
  speed_hf = eng["tokens_per_s"] / hf["tokens_per_s"]
  how = (f"extrapolated from {hf['measured_batches']} batch(es) x <= {args.hf_steps} steps"
         if hf["extrapolated"] else "whole load measured")
  print(f"\nengine vs static batch: {speed_static:.2f}x (target >= 2x); vs transformers "
        f"({how}): {speed_hf:.2f}x (target >= 5x)")
  st = eng["stats"]
  print(f"engine: prefill rows {st['prefill_rows']} for {len(reqs)} requests (shared prompts), "
        f"decode steps {st['decode_steps']}, compilations {st['compilations']}; "
        f"responses identical to static generate: {same}/{len(reqs)}")
  result = dict(quick=args.quick, model=dict(hidden=MODEL.hidden_size, layers=MODEL.num_layers,
                                             vocab=MODEL.vocab_size),
                load=dict(prompts=prompts, group=args.group, requests=len(reqs),
                          tokens=int(budgets.sum()), budget_p50=float(np.median(budgets)),
                          budget_p90=float(np.percentile(budgets, 90)),
                          budget_max=int(budgets.max())),
                platform=jax.devices()[0].platform, cpu_count=os.cpu_count(), results=rows,
                speedup_vs_static=speed_static, speedup_vs_transformers=speed_hf,
                identical_to_static=int(same))
  out = pathlib.Path(args.out or (RESULTS.with_name("rollout_engine_quick.json") if args.quick
                                  else RESULTS))
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=2))
  print(f"wrote {out}")


if __name__ == "__main__":
  main()

"""Decode throughput of our sampler vs `transformers.generate` on the same tiny Qwen2 weights.

Usage: python -m benchmarks.generate [--quick]
Greedy decoding of exactly `new_tokens` tokens (no stop token) for each batch size; our figure
excludes the one-off compilation (reported separately).

Also reported per batch, to show how far a decode step can go on this machine:
- `ours_step_ms` / `hf_step_ms`: wall time per generated token position;
- `matmul_floor_ms`: the step's weight matmuls (q/k/v/o, MLP, unembedding: 2 * batch *
  params-in-matmuls FLOPs) at the GEMM rate torch reaches on this machine for one
  `[batch, hidden] x [hidden, ffn]` product. No decoder that runs those matmuls in float32 steps
  faster, so `hf_step_ms / matmul_floor_ms` bounds the speedup any implementation can show.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import jax
import numpy as np

from benchmarks.common import print_table, timeit, write_json
from jaxrl_sys import models


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--prompt_len", type=int, default=16)
  args = ap.parse_args()
  batches = [1, 8] if args.quick else [1, 8, 64]
  n_new = 32 if args.quick else args.new_tokens
  cfg = models.ModelConfig(vocab_size=2048, hidden_size=256, num_layers=4, num_heads=4,
                           num_kv_heads=2, head_dim=64, intermediate_size=768, max_seq_len=512)
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(max(1, torch.get_num_threads()))
  tmp = tempfile.mkdtemp()
  models.save_hf_checkpoint(tmp, cfg, params)
  tm = transformers.AutoModelForCausalLM.from_pretrained(tmp).float().eval()
  sampling = models.SamplingConfig(temperature=0.0, max_new_tokens=n_new)
  c = cfg
  attn_width = c.head_dim * (c.num_heads * 2 + c.num_kv_heads * 2)
  matmul_params = (c.num_layers * c.hidden_size * (attn_width + 3 * c.intermediate_size)
                   + c.hidden_size * c.vocab_size)
  rows = []
  for b in batches:
    prompt = np.random.default_rng(b).integers(3, 2048, (b, args.prompt_len)).astype(np.int32)
    t0 = time.perf_counter()
    jax.block_until_ready(models.generate(params, cfg, prompt, sampling=sampling).tokens)
    compile_s = time.perf_counter() - t0
    ours = timeit(lambda: jax.block_until_ready(
        models.generate(params, cfg, prompt, sampling=sampling).tokens), repeats=3)
    with torch.no_grad():
      ids = torch.tensor(prompt, dtype=torch.long)
      hf = timeit(lambda: tm.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                      pad_token_id=0), repeats=2, warmup=1)
      x, w = torch.randn(b, c.hidden_size), torch.randn(c.hidden_size, c.intermediate_size)
      gemm = timeit(lambda: [x @ w for _ in range(20)], repeats=5) / 20
    flops_per_s = 2 * b * c.hidden_size * c.intermediate_size / gemm
    floor = 2 * b * matmul_params / flops_per_s
    rows.append({"batch": b, "new_tokens": n_new, "ours_tok_s": b * n_new / ours,
                 "hf_tok_s": b * n_new / hf, "speedup": hf / ours, "ours_compile_s": compile_s,
                 "ours_step_ms": 1e3 * ours / n_new, "hf_step_ms": 1e3 * hf / n_new,
                 "matmul_floor_ms": 1e3 * floor, "torch_gemm_gflops": flops_per_s / 1e9,
                 "max_speedup_at_floor": hf / n_new / floor})
  print_table(rows)
  write_json("generate", {"config": cfg.__dict__ | {"rope": str(cfg.rope)}, "rows": rows})


if __name__ == "__main__":
  main()

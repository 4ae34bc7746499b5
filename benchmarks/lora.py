"""LoRA against full-parameter training: bytes and time of a weight publish and pull, and the
train step's compiled memory.

Usage: python -m benchmarks.lora [--configs tiny,0.5b] [--rank 8] [--repeats 3]
       [--stores tensorstore,ray] [--no_memory]

1. Publish + pull of one version, full weights against adapters (rank `--rank` on attention +
   MLP), both in bfloat16 (the rollout dtype on an accelerator; the adapters' masters stay
   float32 in the trainer), on the tiny preset and on a Qwen2.5-0.5B-shaped model (random
   bytes of the real shapes: nothing is computed with them). `publish_s`: `store.publish` +
   `store.wait` (host copy, checksums, the write or `ray.put`); `pull_s`: a reader's
   `ref.load()` (read + crc32 check); a LoRA worker pulls the base once, then this per version.
   Stores: tensorstore (files under a temporary directory) and Ray (the local object store,
   started here). Best of `--repeats`.
2. Train-step memory: `jit(...).lower(...).compile().memory_analysis()` of the fused GRPO step
   (one micro-batch of `--rows` x `--seq` tokens, `--compute_dtype` compute, bfloat16 by
   default as on an accelerator), arguments (state + batch) and temporaries,
   full-parameter (float32 masters, AdamW moments, reference copy for the KL term) against
   LoRA (the base in bfloat16, float32 adapters and their moments; the reference is the base).
   Lowered from shapes only: nothing is allocated.

3. The bfloat16 rollout engine's log-probs against the float32 trainer's on its own samples,
   adapters unmerged against merged into the base (`--lora.merge`), tiny preset.
4. With `--decode`: seconds per decode step of the engine's jitted decode, bfloat16, the base
   alone, adapters unmerged and merged (what unmerged adapters cost a decoding engine; an
   accelerator's figure: on a CPU the extra matmuls' fixed costs dominate).

Writes benchmarks/results/lora.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from benchmarks.common import print_table, write_json
from jaxrl_sys import models
from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import LoraConfig
from jaxrl_sys.rollout.weights import BaseWeights

QWEN_05B = models.ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                              num_kv_heads=2, head_dim=64, intermediate_size=4864,
                              max_seq_len=4096, tie_embeddings=True, attention_bias=True)


def model_config(name: str) -> models.ModelConfig:
  if name == "0.5b":
    return QWEN_05B
  from jaxrl_sys.train.recipe.presets import load_model  # pylint: disable=import-outside-toplevel
  return load_model(name, max_seq_len=64).config


def random_tree(shapes, seed: int):
  """bfloat16 numpy leaves of `shapes` (random bits of the right size, fast)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32).astype(
      ml_dtypes.bfloat16), shapes)


def make_store(kind: str, root: str):
  if kind == "tensorstore":
    from jaxrl_sys.rollout.weights.tensorstore import TensorstoreWeightStore  # pylint: disable=import-outside-toplevel
    return TensorstoreWeightStore(root)
  from jaxrl_sys.rollout.weights.ray import RayWeightStore  # pylint: disable=import-outside-toplevel
  return RayWeightStore()


def publish_pull(kind: str, name: str, rank: int, repeats: int) -> list[dict]:
  mc = dataclasses.replace(model_config(name), lora=LoraConfig(rank=rank))
  base_shapes = jax.eval_shape(lambda: models.init_params(lora_lib.without_lora(mc),
                                                          jax.random.key(0)))
  ad_shapes = jax.eval_shape(lambda: lora_lib.init_lora(mc, jax.random.key(0)))
  base = random_tree(base_shapes, 0)
  named = BaseWeights("benchmark-base", base)
  rows = []
  with tempfile.TemporaryDirectory() as root:
    for what in ("full", "adapters"):
      store = make_store(kind, f"{root}/{what}")
      best_pub = best_pull = float("inf")
      nbytes = 0
      for v in range(repeats):
        tree = base if what == "full" else random_tree(ad_shapes, v + 1)
        t0 = time.perf_counter()
        if what == "full":
          store.publish(tree, v)
        else:
          store.publish(tree, v, base=named)
        store.wait()
        t1 = time.perf_counter()
        ref = store.published(v)
        ref.load()
        t2 = time.perf_counter()
        if what == "adapters" and v == 0:
          continue  # the first LoRA publish writes the base too (a one-time cost)
        best_pub, best_pull = min(best_pub, t1 - t0), min(best_pull, t2 - t1)
        nbytes = ref.nbytes
        store.gc([])
      store.close()
      rows.append({"store": kind, "model": name, "what": what, "rank": rank if what != "full"
                   else "", "bytes": nbytes, "MiB": nbytes / 2**20, "publish_s": best_pub,
                   "pull_s": best_pull})
  full, ad = rows
  ad["share"] = ad["bytes"] / full["bytes"]
  ad["pull_speedup"] = full["pull_s"] / max(ad["pull_s"], 1e-9)
  return rows


def step_memory(name: str, rank: int, rows: int, seq: int, compute: str) -> list[dict]:
  from jaxrl_sys.sharding import make_mesh  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.batch import TrainBatch  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.config import train_config_for_algo  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.optim import make_optimizer  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.state import abstract_state  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.update import make_train_fns  # pylint: disable=import-outside-toplevel
  out = []
  mesh = make_mesh("1x1")
  tc = train_config_for_algo("grpo", kl_coef=0.001, remat=True)
  i32, f32 = jnp.int32, jnp.float32
  spec = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt)  # noqa: E731
  window = seq // 2  # the scored response positions
  batch = TrainBatch(tokens=spec((rows, seq), i32), targets=spec((rows, window), i32),
                     attention_mask=spec((rows, seq), i32), loss_mask=spec((rows, window), f32),
                     behav_logprobs=spec((rows, window), f32), versions=spec((rows, window), i32),
                     advantages=spec((rows,), f32), score_start=spec((rows,), i32))
  for what in ("full", "lora"):
    mc = dataclasses.replace(model_config(name), compute_dtype=compute)
    if what == "lora":
      mc = dataclasses.replace(mc, lora=LoraConfig(rank=rank))
    opt = make_optimizer(tc.optim, moment_dtype="float32")
    abstract = abstract_state(mc, tc, opt)
    if what == "lora":  # the base in bfloat16 (a real checkpoint's dtype)
      abstract = abstract._replace(base=jax.tree.map(lambda s: spec(s.shape, jnp.bfloat16),
                                                     abstract.base))
    fns = make_train_fns(mc, tc, opt, abstract, mesh)
    mem = fns.fused_step.lower(abstract, batch).compile().memory_analysis()
    arg, temp = int(mem.argument_size_in_bytes), int(mem.temp_size_in_bytes)
    out.append({"model": name, "train": what, "rank": rank if what == "lora" else "",
                "args_MiB": arg / 2**20, "temp_MiB": temp / 2**20,
                "total_MiB": (arg + temp) / 2**20})
  out[1]["vs_full"] = out[1]["total_MiB"] / out[0]["total_MiB"]
  return out


def engine_mismatch(rank: int, std: float = 1e-3, requests: int = 16) -> list[dict]:
  """Log-prob difference of a bfloat16 rollout engine from the float32 trainer, adapters
  unmerged against merged (`--lora.merge`), on the tiny preset with adapters of a few
  optimizer steps (B ~ N(0, std)): the engine samples, the trainer recomputes its tokens."""
  from jaxrl_sys.rollout import Request, request_key  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.engine.config import EngineConfig  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.engine.engine import Engine  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step import batch as batch_lib  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.config import TrainConfig  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.logprobs import token_logprobs  # pylint: disable=import-outside-toplevel
  mc = dataclasses.replace(model_config("tiny"), lora=LoraConfig(rank=rank))
  base = models.init_params(lora_lib.without_lora(mc), jax.random.key(0))
  ad = jax.tree_util.tree_map_with_path(
      lambda p, x: std * jax.random.normal(jax.random.key(1), x.shape) if p[-1].key == "b"
      else x, lora_lib.init_lora(mc, jax.random.key(2)))
  rng = np.random.default_rng(0)
  ec = EngineConfig(num_slots=requests, max_len=32, prefill_buckets=(16,),
                    prefill_batch_buckets=(requests,), decode_row_buckets=(requests,),
                    decode_len_buckets=(32,), sampling=models.SamplingConfig(temperature=1.0))
  trainer = jax.jit(lambda b: token_logprobs(base, mc, TrainConfig(), b, None, ec.sampling,
                                             lora=ad)[0])
  out = []
  for merge in (False, True):
    cfg = dataclasses.replace(mc, param_dtype="bfloat16", compute_dtype="bfloat16",
                              lora=dataclasses.replace(mc.lora, merge=merge))
    cast = lambda t: jax.tree.map(lambda x: x.astype(jnp.bfloat16), t)  # noqa: E731
    engine = Engine(cfg, cast(ad), ec, base=cast(base))
    engine.submit([Request(i, rng.integers(3, mc.vocab_size, 6), 12, request_key(0, i))
                   for i in range(requests)])
    done = engine.run()
    samples = [batch_lib.Sample(c.request.prompt.astype(np.int32),
                                np.asarray(c.request.tokens, np.int32),
                                np.asarray(c.request.logprobs, np.float32),
                                np.zeros(len(c.request.tokens), np.int32), 0.0) for c in done]
    batch = batch_lib.pack(samples, requests, 18)
    mask = np.asarray(batch.loss_mask) > 0
    diff = np.abs(np.asarray(trainer(batch))[mask] - np.asarray(batch.behav_logprobs)[mask])
    out.append({"engine": "bf16 " + ("merged" if merge else "unmerged"), "rank": rank,
                "B_std": std, "tokens": int(mask.sum()), "mean_abs_diff": float(diff.mean()),
                "max_abs_diff": float(diff.max())})
  return out


# A Qwen3-8B layer's widths (hidden 4096, MLP 12288, 32 / 8 heads of 128) in 4 layers: the
# per-layer cost of decoding at 8B-class widths, in a model small enough to compile quickly.
WIDE_SLICE = models.ModelConfig(vocab_size=151936, hidden_size=4096, num_layers=4, num_heads=32,
                                num_kv_heads=8, head_dim=128, intermediate_size=12288,
                                max_seq_len=4096, qk_norm=True)


def decode_speed(name: str, rank: int, batch: int, context: int, steps: int = 32,
                 repeats: int = 3) -> list[dict]:
  """Seconds per decode step of the engine's jitted decode (`rollout.engine.slots.decode`),
  `batch` rows each attending `context` cached tokens, bfloat16: the base alone, adapters
  unmerged (rank `rank` on attention + MLP) and merged into the base."""
  from jaxrl_sys.models import kv_cache as kvc  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.engine import slots  # pylint: disable=import-outside-toplevel
  cfg = WIDE_SLICE if name == "8b-slice" else model_config(name)
  cfg = dataclasses.replace(cfg, param_dtype="bfloat16", compute_dtype="bfloat16")
  mc = dataclasses.replace(cfg, lora=LoraConfig(rank=rank))
  base = models.init_params(cfg, jax.random.key(0))
  ad = jax.tree.map(lambda x: x.astype(jnp.bfloat16), lora_lib.init_lora(mc, jax.random.key(1)))
  ad = jax.tree_util.tree_map_with_path(
      lambda p, x: (1e-3 * jnp.ones_like(x)) if p[-1].key == "b" else x, ad)
  merged = lora_lib.merge_lora(base, ad, config=mc)
  sampling = models.SamplingConfig(temperature=1.0)
  width = context + (repeats + 1) * steps
  rows = []
  for what, params, lora, config in (("base", base, None, cfg), ("unmerged", base, ad, mc),
                                     ("merged", merged, None, mc)):
    cache = kvc.init_cache(config, batch, width)
    cache = cache._replace(kv_valid=cache.kv_valid.at[:, :context].set(True),
                           write_pos=jnp.full((batch,), context, jnp.int32),
                           next_position=jnp.full((batch,), context, jnp.int32))
    args = (jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, 2), jnp.uint32),
            jnp.zeros((batch,), jnp.int32), jnp.full((batch,), 10**6, jnp.int32),
            jnp.ones((batch,), bool), None, lora)
    kw = dict(config=config, sampling=sampling, num_steps=steps, width=width)
    out = slots.decode(params, cache, *args, **kw)  # compile + warm
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(repeats):
      t0 = time.perf_counter()
      out = slots.decode(params, out[0], *args, **kw)
      jax.block_until_ready(out)
      best = min(best, time.perf_counter() - t0)
    rows.append({"model": name, "batch": batch, "context": context, "weights": what,
                 "rank": rank if what != "base" else "", "ms_per_token_step": 1e3 * best / steps})
  for r in rows[1:]:
    r["vs_base"] = r["ms_per_token_step"] / rows[0]["ms_per_token_step"]
  return rows


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--configs", default="tiny,0.5b")
  ap.add_argument("--stores", default="tensorstore,ray")
  ap.add_argument("--rank", type=int, default=8)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--rows", type=int, default=8)
  ap.add_argument("--seq", type=int, default=512)
  ap.add_argument("--no_memory", action="store_true")
  ap.add_argument("--compute_dtype", default="bfloat16",
                  help="the train step's compute dtype (bfloat16: as on an accelerator)")
  ap.add_argument("--no_mismatch", action="store_true")
  ap.add_argument("--decode", default="",
                  help="comma list of models (tiny, 0.5b, 8b-slice) to time decode steps of: "
                  "base, adapters unmerged, merged (an accelerator's figure)")
  ap.add_argument("--decode_batch", type=int, default=64)
  ap.add_argument("--decode_context", type=int, default=1024)
  args = ap.parse_args(argv)
  configs, stores = args.configs.split(","), args.stores.split(",")
  if "ray" in stores:
    from jaxrl_sys.rollout.workers.ray import import_ray, init_ray  # pylint: disable=import-outside-toplevel
    if not import_ray().is_initialized():
      init_ray(object_store_memory=3 * 2**30)
  pulls = [r for kind in stores if kind for name in configs
           for r in publish_pull(kind, name, args.rank, args.repeats)]
  if pulls:
    print(f"\npublish + pull of one version (bfloat16; rank {args.rank} on attention + MLP)")
    print_table(pulls, ["store", "model", "what", "MiB", "publish_s", "pull_s", "share",
                        "pull_speedup"])
  memory = []
  if not args.no_memory:
    memory = [r for name in configs
              for r in step_memory(name, args.rank, args.rows, args.seq, args.compute_dtype)]
    print(f"\ntrain-step memory (fused GRPO step, {args.rows} x {args.seq} tokens, remat, "
          f"{args.compute_dtype} compute; compiled arguments + temporaries)")
    print_table(memory, ["model", "train", "rank", "args_MiB", "temp_MiB", "total_MiB",
                         "vs_full"])
  mismatch = [] if args.no_mismatch else engine_mismatch(args.rank)
  if mismatch:
    print("\nbf16 rollout engine vs float32 trainer log-probs (tiny preset, adapters "
          "B ~ N(0, 1e-3))")
    print_table(mismatch)
  decode = [r for name in filter(None, args.decode.split(","))
            for r in decode_speed(name, args.rank, args.decode_batch, args.decode_context)]
  if decode:
    print(f"\ndecode step time, bfloat16, {jax.devices()[0].device_kind}")
    print_table(decode, ["model", "batch", "context", "weights", "rank", "ms_per_token_step",
                         "vs_base"])
  payload = {"args": vars(args), "publish_pull": pulls, "step_memory": memory,
             "engine_mismatch": mismatch, "decode": decode}
  write_json("lora", payload)
  return payload


if __name__ == "__main__":
  main()

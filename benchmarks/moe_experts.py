"""The routed-expert implementations on XLA:CPU: forward and gradient time per layer call.

    python -m benchmarks.moe_experts [--repeats 10]

Shapes of the peer comparison's Qwen3-MoE (hidden 256, 8 experts of width 256, top-2), at a
training micro-batch (64 rows x 40 positions = 2560 tokens) and a decode step (64 tokens), with
a balanced router (what BIP / aux-free balancing give) and a skewed one (max load about 2.4x
the mean, as an untrained router without balancing gives). The CPU default
(`implementation="auto"`) runs "slots" at the decode size (its own path when the loads fit its
slots, twice the slots or the dense einsum when they do not) and "segments" at the training
size (exact work for any routing). Writes benchmarks/results/moe_experts.json.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import print_table, write_json  # noqa: E402
from jaxrl_sys.models.moe import block as moe  # noqa: E402
from jaxrl_sys.models.moe import blocked as moe_blocked  # noqa: E402
from jaxrl_sys.models.moe import experts as moe_experts  # noqa: E402
from jaxrl_sys.models.moe import segments as moe_segments  # noqa: E402
from jaxrl_sys.models.moe import slots as moe_slots  # noqa: E402

D, F, E, K = 256, 256, 8, 2
IMPLS = {
    "dense": lambda p, x, e, g, a: moe_experts.dense_experts(p, x, e, jnp.where(a, g, 0.0)),
    "blocked": moe_blocked.blocked_experts,
    "slots": moe_slots.slot_experts,
    "segments": moe_segments.segment_experts,
}


def routing(tokens: int, skew: float, seed: int = 0):
  """Top-2 of a random router whose logits lean by `skew` towards the last experts."""
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(rng.normal(size=(tokens, E)), jnp.float32) + skew * jnp.linspace(0, 1, E)
  g, experts = jax.lax.top_k(jax.nn.softmax(logits), K)
  return experts.astype(jnp.int32), g / g.sum(-1, keepdims=True), jnp.ones((tokens, K), bool)


def best_ms(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeats", type=int, default=10)
  args = ap.parse_args()
  rng = np.random.default_rng(1)
  p = {n: jnp.asarray(rng.normal(size=s) * 0.05, jnp.float32)
       for n, s in (("w_gate", (E, D, F)), ("w_up", (E, D, F)), ("w_down", (E, F, D)))}
  rows = []
  for tokens in (2560, 64):
    x = jnp.asarray(rng.normal(size=(tokens, D)), jnp.float32)
    for skew in (0.0, 2.0):
      experts, gates, active = routing(tokens, skew)
      load = np.bincount(np.asarray(experts).ravel(), minlength=E)
      ref = IMPLS["dense"](p, x, experts, gates, active)
      for name, impl in IMPLS.items():
        fwd = jax.jit(lambda p, x, g, impl=impl: impl(p, x, experts, g, active))
        grad = jax.jit(jax.grad(lambda p, x, g, impl=impl: jnp.sum(
            impl(p, x, experts, g, active) ** 2), argnums=(0, 1, 2)))
        err = float(jnp.max(jnp.abs(fwd(p, x, gates) - ref)))
        rows.append({"tokens": tokens, "router": "skewed" if skew else "balanced",
                     "max_load_over_mean": float(load.max() / load.mean()),
                     "slot_capacity_over_mean": moe_slots.slot_capacity(tokens * K, E)
                     / load.mean(), "impl": name,
                     "auto": name == moe.resolve_implementation("auto", tokens, E),
                     "fwd_ms": best_ms(fwd, (p, x, gates), args.repeats),
                     "grad_ms": best_ms(grad, (p, x, gates), args.repeats),
                     "max_abs_err_vs_dense": err})
        print(rows[-1], flush=True)
  print_table(rows, ["tokens", "router", "max_load_over_mean", "impl", "auto", "fwd_ms", "grad_ms",
                     "max_abs_err_vs_dense"])
  write_json("moe_experts", {"shapes": {"hidden": D, "expert_width": F, "experts": E, "top_k": K},
                             "rows": rows})


if __name__ == "__main__":
  main()

"""Block-sparse routed experts: an exact dropless path for XLA:CPU (one batched GEMM over
gathered per-block weights; `moe_segments` reuses its layout without the weight gather).

`jax.lax.ragged_dot` runs on XLA:CPU as one dense matmul per group (E times the work), and the
dense einsum reference runs every expert on every token (E / k times the work). Here the
assignments are sorted by expert and each expert's rows are padded up to a multiple of a row
block, so every block belongs to one expert; the experts then run as one batched GEMM over the
blocks (`[blocks, block, d] x [blocks, d, f]`, the weights gathered per block).

Shapes are static: `A = tokens * k` assignments need at most `A + E * (block - 1)` rows, rounded
up to whole blocks, whatever the routing. The result is exact (no capacity, no dropping; inactive
assignments cost nothing but their share of the padding) and equals `dense_experts` up to float
rounding, in values and gradients (router gates included).

Layout (`BlockLayout`), for `A` assignments, `R` padded rows in `nb` blocks:
  row `[A]` int32: the padded row of each flat assignment (`R` = none: inactive);
  src `[R]` int32: the token each row reads (`tokens` = the zero row: padding);
  block_expert `[nb]` int32: the expert of each block;
  owner `[R]` int32: the flat assignment of each row (`A` = padding);
  used: scalar int32, the blocks that hold assignments (the first `used`; the rest is padding).
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.models.moe import experts as moe_experts
from jaxrl_sys.models.layers import swiglu


class BlockLayout(NamedTuple):
  """Where each assignment lives in the expert-sorted, block-padded row buffer (see above)."""
  row: jax.Array
  src: jax.Array
  block_expert: jax.Array
  owner: jax.Array
  used: jax.Array


def block_size(num_assignments: int, num_experts: int, max_block: int = 128) -> int:
  """Rows per block: a power of two in [8, max_block] with `E * block <= A / 4`, so padding
  adds at most a quarter to the rows (smaller blocks for small batches, e.g. decoding)."""
  block = 8
  while block * 2 <= max_block and num_experts * block * 2 * 4 <= num_assignments:
    block *= 2
  return block


def num_blocks(num_assignments: int, num_experts: int, block: int) -> int:
  """Static block count that holds any routing of `num_assignments` over `num_experts`."""
  return -(-(num_assignments + num_experts * (block - 1)) // block)


def block_layout(experts: jax.Array, active: jax.Array, num_experts: int,
                 block: int) -> BlockLayout:
  """Sorts the assignments `experts`/`active` `[tokens, k]` by expert into padded blocks."""
  n, k = experts.shape
  a = n * k
  nb = num_blocks(a, num_experts, block)
  rows = nb * block
  order, sizes, sorted_ids = moe_experts.sort_by_expert(experts, active, num_experts)
  padded = (sizes + block - 1) // block * block
  pad_end = jnp.cumsum(padded)
  row, owner = moe_experts.place_sorted(order, sorted_ids, sizes, pad_end - padded, a + 1, rows)
  src = jnp.where(owner < a, owner // k, n)
  starts = jnp.arange(nb, dtype=jnp.int32) * block
  block_expert = jnp.minimum(jnp.searchsorted(pad_end, starts, side="right"), num_experts - 1)
  return BlockLayout(row, src.astype(jnp.int32), block_expert.astype(jnp.int32), owner,
                     (pad_end[-1] // block).astype(jnp.int32))


def blocked_experts(p: dict, x: jax.Array, experts: jax.Array, gates: jax.Array,
                    active: jax.Array, block: int | None = None,
                    adapters: dict | None = None) -> jax.Array:
  """SwiGLU experts as one batched GEMM over expert-sorted row blocks.

  Args:
    p: {"w_gate", "w_up": `[E, d, f]`, "w_down": `[E, f, d]`}.
    x: `[tokens, d]` (compute dtype).
    experts, gates, active: `[tokens, k]` routing (int32 ids, float32 gates, bool).
    block: rows per block (default `block_size(tokens * k, E)`).
    adapters: LoRA adapters by weight name (`models.lora.Adapter`, A `[E, in, r]`, B
      `[E, r, out]`), gathered per block like the weights, or None.

  Returns:
    `[tokens, d]` in x's dtype: `sum_k gate * expert(x)` over active assignments.
  """
  chex.assert_equal_shape([experts, gates, active])
  n, k = experts.shape
  d, dt = x.shape[1], x.dtype
  num_experts = p["w_gate"].shape[0]
  block = block or block_size(n * k, num_experts)
  lay = block_layout(experts, active, num_experts, block)
  nb = lay.block_expert.shape[0]
  xs = moe_experts.gather_rows(x, lay.src).reshape(nb, block, d)
  w = {name: p[name].astype(dt)[lay.block_expert] for name in ("w_gate", "w_up", "w_down")}
  ad = {n: a._replace(a=a.a[lay.block_expert], b=a.b[lay.block_expert])
        for n, a in (adapters or {}).items()}

  def mm(a, name):
    y = jnp.einsum("bmi,bio->bmo", a, w[name])
    if name in ad:
      y = y + moe_experts.adapter_einsum(ad[name], a, "bmi,bir->bmr", "bmr,bro->bmo")
    return y

  y = mm(swiglu(mm(xs, "w_gate"), mm(xs, "w_up")), "w_down").reshape(nb * block, d)
  ya = moe_experts.gather_rows(y, jnp.where(active.reshape(-1), lay.row, nb * block)).reshape(
      n, k, d)
  return jnp.einsum("nkd,nk->nd", ya, gates.astype(dt))

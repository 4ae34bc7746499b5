"""Expert segments run block by block: the exact, capacity-free path for training sizes on
XLA:CPU.

The assignments are sorted by expert into the block-padded layout of `moe_blocked.block_layout`:
expert e owns `ceil(load_e / block)` consecutive blocks of `block` rows, the last one topped up
with zero rows. A loop over the experts then runs each expert's blocks one by one, each as one
`[block, d] x [d, f]` GEMM on that expert's weights as they are stored (sliced once per
expert). The work follows the loads exactly (at most `A + E * block` rows, whatever the routing:
no capacity to overflow, no fallback, no dropping), with no per-block weight gather
(`moe_blocked` gathers `[blocks, d, f]` weights for one batched GEMM) and no capacity padding
(`moe_slots` runs 1.5x the balanced load). Zero rows give zero outputs and, with their zero
cotangents, add nothing to the weight gradients, so no step needs a mask.

The backward is written out (a custom VJP) as the same loops: each expert's weight gradients
are summed over its blocks in float32 and written to its slice of `[E, d, f]`, the blocks' row
cotangents written in place; the moves between tokens and rows are gathers (each row has at
most one assignment, each active assignment one row).
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.models import moe_blocked
from jaxrl_sys.models.layers import swiglu, swiglu_grads

_NAMES = ("w_gate", "w_up", "w_down")


def block_rows(num_assignments: int, num_experts: int) -> int:
  """Rows per block: half the balanced load `A / (2E)` rounded up to a multiple of 8 (at least
  8), so the zero rows add at most about a quarter on average and the GEMMs stay large."""
  c = -(-num_assignments // (2 * num_experts))
  return max(8, -(-c // 8) * 8)


def _at(a: jax.Array, i: jax.Array) -> jax.Array:
  """`a[i]` for a traced scalar `i`, as a dynamic slice (not a gather)."""
  return jax.lax.dynamic_index_in_dim(a, i, keepdims=False)


def _expert_blocks(lay: moe_blocked.BlockLayout, num_experts: int):
  """(first block `[E]`, block count `[E]`) of each expert; an expert's blocks are consecutive."""
  used = (jnp.arange(lay.block_expert.shape[0]) < lay.used).astype(jnp.int32)
  counts = jnp.zeros((num_experts,), jnp.int32).at[lay.block_expert].add(used)
  return jnp.cumsum(counts) - counts, counts


def _blocks_forward(w, xs, lay: moe_blocked.BlockLayout, block: int, hidden: bool):
  """SwiGLU of the used blocks of `xs [R, d]` -> y `[R, d]`, with the gate and up
  pre-activations `[R, f]` as well when `hidden` (the backward's residuals).

  Two loops: over experts (each slices its weights once), then over that expert's blocks."""
  rows, d = xs.shape
  num_experts, _, f = w["w_gate"].shape
  first, counts = _expert_blocks(lay, num_experts)

  def expert(e, bufs):
    wg, wu, wd = (_at(w[name], e) for name in _NAMES)

    def blk(i, bufs):
      xc = jax.lax.dynamic_slice_in_dim(xs, i * block, block)
      gc, uc = xc @ wg, xc @ wu
      yc = swiglu(gc, uc) @ wd
      return tuple(jax.lax.dynamic_update_slice_in_dim(buf, c, i * block, 0)
                   for buf, c in zip(bufs, (yc, gc, uc)))

    return jax.lax.fori_loop(first[e], first[e] + counts[e], blk, bufs)

  bufs = (jnp.zeros((rows, d), xs.dtype),)
  if hidden:
    bufs += (jnp.zeros((rows, f), xs.dtype), jnp.zeros((rows, f), xs.dtype))
  return jax.lax.fori_loop(0, num_experts, expert, bufs)


def _blocks_backward(w, xs, g, u, dy, lay: moe_blocked.BlockLayout, block: int):
  """Cotangents (weights as float32 `[E, ., .]`, rows `[R, d]`) of `_blocks_forward`."""
  f32 = jnp.float32
  num_experts = w["w_gate"].shape[0]
  first, counts = _expert_blocks(lay, num_experts)

  def expert(e, carry):
    dxs, dws = carry
    wg, wu, wd = (_at(w[name], e) for name in _NAMES)

    def blk(i, carry):
      dxs, dwg, dwu, dwd = carry
      xc, gc, uc, dyc = (jax.lax.dynamic_slice_in_dim(a, i * block, block)
                         for a in (xs, g, u, dy))
      dgc, duc = swiglu_grads(gc, uc, dyc @ wd.T)

      def mm(a, b):  # a^T b in float32
        return jnp.dot(a.T, b, preferred_element_type=f32)

      dxc = dgc @ wg.T + duc @ wu.T
      return (jax.lax.dynamic_update_slice_in_dim(dxs, dxc, i * block, 0), dwg + mm(xc, dgc),
              dwu + mm(xc, duc), dwd + mm(swiglu(gc, uc), dyc))

    init = (dxs,) + tuple(jnp.zeros(w[name].shape[1:], f32) for name in _NAMES)
    dxs, *dw = jax.lax.fori_loop(first[e], first[e] + counts[e], blk, init)
    return dxs, tuple(jax.lax.dynamic_update_index_in_dim(acc, v, e, 0)
                      for acc, v in zip(dws, dw))

  init = (jnp.zeros_like(xs), tuple(jnp.zeros(w[name].shape, f32) for name in _NAMES))
  dxs, dws = jax.lax.fori_loop(0, num_experts, expert, init)
  return dict(zip(_NAMES, dws)), dxs


def _zero_row(a: jax.Array) -> jax.Array:
  """`a [m, d]` with a zero row appended (the row that index `m` gathers)."""
  return jnp.concatenate([a, jnp.zeros((1, a.shape[1]), a.dtype)])


def _run(w, x, gates, experts, active, block: int, hidden: bool):
  n, k = experts.shape
  dt = x.dtype
  wc = {name: w[name].astype(dt) for name in _NAMES}
  lay = moe_blocked.block_layout(experts, active, wc["w_gate"].shape[0], block)
  xs = _zero_row(x)[lay.src]
  y, *gu = _blocks_forward(wc, xs, lay, block, hidden)
  ya = _zero_row(y)[lay.row].reshape(n, k, -1)        # inactive assignments: the zero row
  out = jnp.einsum("nkd,nk->nd", ya, gates.astype(dt))
  return out, (w, xs, *gu, ya, lay, gates)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _experts(w, x, gates, experts, active, block):
  return _run(w, x, gates, experts, active, block, hidden=False)[0]


def _experts_fwd(w, x, gates, experts, active, block):
  return _run(w, x, gates, experts, active, block, hidden=True)


def _experts_bwd(block, saved, dout):
  w, xs, g, u, ya, lay, gates = saved
  n, k, d = ya.shape
  dt = xs.dtype
  wc = {name: w[name].astype(dt) for name in _NAMES}
  dgates = jnp.einsum("nkd,nd->nk", ya.astype(jnp.float32),
                      dout.astype(jnp.float32)).astype(gates.dtype)
  dya = (dout[:, None, :] * gates[..., None].astype(dt)).reshape(n * k, d)
  dw, dxs = _blocks_backward(wc, xs, g, u, _zero_row(dya)[lay.owner], lay, block)
  dx = _zero_row(dxs)[lay.row].reshape(n, k, d).sum(axis=1)
  return ({name: dw[name].astype(w[name].dtype) for name in _NAMES}, dx, dgates, None, None)


_experts.defvjp(_experts_fwd, _experts_bwd)


def segment_experts(p: dict, x: jax.Array, experts: jax.Array, gates: jax.Array,
                    active: jax.Array, block: int | None = None) -> jax.Array:
  """SwiGLU experts over expert-sorted segments, block by block (exact; see the module doc).

  Args:
    p: {"w_gate", "w_up": `[E, d, f]`, "w_down": `[E, f, d]`}.
    x: `[tokens, d]` (compute dtype).
    experts, gates, active: `[tokens, k]` routing (int32 ids, float32 gates, bool).
    block: rows per block (default `block_rows(tokens * k, E)`).

  Returns:
    `[tokens, d]` in x's dtype: `sum_k gate * expert(x)` over active assignments. Weight
    cotangents come back in the weights' dtype (accumulated in float32).
  """
  chex.assert_equal_shape([experts, gates, active])
  n, k = experts.shape
  num_experts = p["w_gate"].shape[0]
  block = block or block_rows(n * k, num_experts)
  if block < 1:
    raise ValueError(f"block must be a positive row count, got {block}")
  w = {name: p[name] for name in _NAMES}
  return _experts(w, x, jnp.where(active, gates, 0.0), experts, active, block)

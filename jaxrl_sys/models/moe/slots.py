"""Expert-major slot buffers: the fast dropless path for XLA:CPU at decode sizes.

Each expert owns `C` consecutive rows ("slots") of a `[E * C, d]` buffer, `C = slot_capacity(A,
E)` for `A = tokens * k` assignments (1.5x the balanced load, a multiple of 8), at most `tokens`
(an expert gets at most one assignment per token, so `C = tokens` never overflows). The assignments
are written to their expert's slots in token order and the experts run as one batched GEMM
`[E, C, d] x [E, d, f]` on the weights as they are: no per-block weight gather (as in
`moe_blocked`), no scatter-add of weight gradients, and one GEMM call per weight however many
experts there are, which is what decode steps (A = 2 x batch) need. At training sizes
`moe.resolve_implementation` runs `moe_segments` instead, where the 1.5x padding costs more.

Exact and dropless: when some expert receives more than `C` assignments, the layer runs an
exact path instead (decided on device per call). A non-differentiated call at decode sizes (the
rollout's decode steps) sorts once and picks the smallest of four slot tiers from `C` up to
`DOUBLE_SLOTS_MAX` of the tokens (`slot_tiers`: 24, 32, 40, 48 at 64 tokens) that holds the
largest load (`lax.switch`), then `dense_experts`: an untrained router's decode loads spread
over those tiers, and each tier runs only the rows it needs. A differentiated call tries twice
the slots, then `dense_experts`; above decode sizes the fallback is
`moe_segments.segment_experts`. No assignment is ever dropped; with balanced routing (BIP,
aux-free, or a capacity factor up to 1.5) the slots always suffice.

The backward is written out (a custom VJP): the moves between token rows and slots are
gathers whose transposes are again gathers (each assignment has one slot, each slot at most one
assignment), not the scatter-adds autodiff would emit; and the on-device choice between the
slot path and the fallback costs nothing in the common case (under autodiff a `lax.cond` would
otherwise materialise the untaken branch's residuals as zeros on every call).
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys.models.moe import experts as moe_experts
from jaxrl_sys.models.moe import segments as moe_segments
from jaxrl_sys.models.layers import swiglu, swiglu_grads

SLOT_FACTOR = 1.5
# Overflow fallback: at most this many expert x token rows run every expert on every token
# (`dense_experts`, no weight gathers: faster at decode sizes on XLA:CPU, e.g. 64 tokens x 8
# experts in 2.5 ms vs 2.9 ms blocked, 128 x 8 in 3.1 vs 6.6 ms); more go to `segment_experts`.
# `moe.resolve_implementation` runs `segment_experts` itself above this size.
DENSE_FALLBACK_ROWS = 4096
# At decode sizes an overflow runs more slots while they are at most this fraction of the tokens
# (64 tokens x 8 experts, top-2: 48 slots in 1.7 ms against 2.4 ms dense; 56 or 64 slots cost
# what dense costs).
DOUBLE_SLOTS_MAX = 0.75


def slot_capacity(num_assignments: int, num_experts: int, factor: float = SLOT_FACTOR) -> int:
  """Slots per expert: `ceil(factor * A / E)` rounded up to a multiple of 8 (at least 8)."""
  c = -(-int(factor * num_assignments) // num_experts)
  return max(8, -(-c // 8) * 8)


def slot_layout(experts: jax.Array, active: jax.Array, num_experts: int, capacity: int):
  """Slot of each assignment, in token order within each expert.

  Args:
    experts, active: `[tokens, k]` routing.
    num_experts, capacity: E and C.

  Returns:
    (slot `[A]` int32 in `[0, E*C]` (`E*C` = inactive or over capacity), owner `[E*C]` int32
    assignment of each slot (`A` = empty), load `[E]` int32 active assignments per expert).
  """
  order, load, sorted_ids = moe_experts.sort_by_expert(experts, active, num_experts)
  return (*_place(order, load, sorted_ids, capacity), load)


def _place(order, load, sorted_ids, capacity: int):
  """(slot, owner) of `slot_layout` from a `sort_by_expert` result, for `capacity` slots."""
  num_experts = load.shape[0]
  return moe_experts.place_sorted(order, sorted_ids, load, jnp.arange(num_experts) * capacity,
                                  capacity, num_experts * capacity)


def _fallback(p, x, experts, gates, active, capacity: int):
  """The exact path for a call whose routing overflows `capacity` slots (gates already masked):
  at decode sizes twice the slots while that stays under `DOUBLE_SLOTS_MAX` of the tokens, then
  `dense_experts`; `segment_experts` above decode sizes."""
  n = x.shape[0]
  if n * p["w_gate"].shape[0] > DENSE_FALLBACK_ROWS:
    return moe_segments.segment_experts(p, x, experts, gates, active)
  if 2 * capacity <= DOUBLE_SLOTS_MAX * n:
    return slot_experts(p, x, experts, gates, active, capacity=2 * capacity)
  return moe_experts.dense_experts(p, x, experts, gates)


def _slot_forward(p, x, gates, slot, owner, k: int, capacity: int):
  """The slot path; returns (out `[tokens, d]`, residuals (xs, g, u, ya) for `_slot_backward`)."""
  n = x.shape[0]
  d, dt = x.shape[1], x.dtype
  num_experts = p["w_gate"].shape[0]
  s, a = num_experts * capacity, n * k
  xs = moe_experts.gather_rows(x, jnp.where(owner < a, owner // k, n)).reshape(
      num_experts, capacity, d)
  g = jnp.einsum("emd,edf->emf", xs, p["w_gate"].astype(dt))
  u = jnp.einsum("emd,edf->emf", xs, p["w_up"].astype(dt))
  y = jnp.einsum("emf,efd->emd", swiglu(g, u), p["w_down"].astype(dt)).reshape(s, d)
  ya = moe_experts.gather_rows(y, slot).reshape(n, k, d)
  return jnp.einsum("nkd,nk->nd", ya, gates.astype(dt)), (xs, g, u, ya)


def _slot_backward(p, gates, slot, owner, res, dout):
  """Cotangents (p, x, gates) of `_slot_forward`; the row moves are gathers (see module doc)."""
  xs, g, u, ya = res
  num_experts, capacity, d = xs.shape
  n, k, _ = ya.shape
  dt = xs.dtype
  f32 = jnp.float32
  dgates = jnp.einsum("nkd,nd->nk", ya.astype(f32), dout.astype(f32)).astype(gates.dtype)
  dya = (dout[:, None, :] * gates[..., None].astype(dt)).reshape(n * k, d)
  dy = moe_experts.gather_rows(dya, owner).reshape(num_experts, capacity, d)
  wg, wu, wd = (p[name].astype(dt) for name in ("w_gate", "w_up", "w_down"))
  dh = jnp.einsum("emd,efd->emf", dy, wd)
  dwd = jnp.einsum("emf,emd->efd", swiglu(g, u), dy)
  dg, du = swiglu_grads(g, u, dh)
  dwg = jnp.einsum("emd,emf->edf", xs, dg)
  dwu = jnp.einsum("emd,emf->edf", xs, du)
  dxs = jnp.einsum("emf,edf->emd", dg, wg) + jnp.einsum("emf,edf->emd", du, wu)
  dx = moe_experts.gather_rows(dxs.reshape(num_experts * capacity, d), slot).reshape(
      n, k, d).sum(axis=1)
  dp = {"w_gate": dwg.astype(p["w_gate"].dtype), "w_up": dwu.astype(p["w_up"].dtype),
        "w_down": dwd.astype(p["w_down"].dtype)}
  return dp, dx, dgates


def _slot_plan(p, x, gates, experts, active, capacity):
  """(slot, owner, fits: the loads fit the slots, run: the slot forward as a thunk)."""
  slot, owner, load = slot_layout(experts, active, p["w_gate"].shape[0], capacity)
  run = functools.partial(_slot_forward, p, x, gates, slot, owner, experts.shape[1], capacity)
  return slot, owner, jnp.max(load) <= capacity, run


def slot_tiers(tokens: int, num_experts: int, capacity: int, count: int = 4) -> tuple[int, ...]:
  """Slot capacities the non-differentiated call picks from at decode sizes: `capacity`, then
  steps of a multiple of 8 up to `DOUBLE_SLOTS_MAX * tokens` (at most `count` tiers); () above
  decode sizes. 64 tokens, top-2 of 8 experts: (24, 32, 40, 48)."""
  if tokens * num_experts > DENSE_FALLBACK_ROWS:
    return ()
  top = max(capacity, min(tokens, int(DOUBLE_SLOTS_MAX * tokens)))
  step = max(8, -(-(top - capacity) // (8 * max(count - 1, 1))) * 8)
  return tuple(range(capacity, top, step)) + (top,)


def _tiered(p, x, gates, experts, active, tiers):
  """The non-differentiated call at decode sizes: one sort, then the smallest slot tier that
  holds the largest load (`lax.switch`, decided on device), `dense_experts` past the last."""
  num_experts, k = p["w_gate"].shape[0], experts.shape[1]
  order, load, sorted_ids = moe_experts.sort_by_expert(experts, active, num_experts)

  def branch(c):
    return lambda: _slot_forward(p, x, gates, *_place(order, load, sorted_ids, c), k, c)[0]

  tier = jnp.sum(jnp.asarray(tiers, jnp.int32) < jnp.max(load))
  return jax.lax.switch(tier, [branch(c) for c in tiers]
                        + [lambda: moe_experts.dense_experts(p, x, experts, gates)])


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _experts(p, x, gates, experts, active, capacity):
  # Not differentiated (decoding, reference forwards): no residuals to carry out of the cond.
  tiers = slot_tiers(x.shape[0], p["w_gate"].shape[0], capacity)
  if tiers:
    return _tiered(p, x, gates, experts, active, tiers)
  _, _, fits, run = _slot_plan(p, x, gates, experts, active, capacity)
  return jax.lax.cond(fits, lambda: run()[0],
                      lambda: _fallback(p, x, experts, gates, active, capacity))


def _experts_fwd(p, x, gates, experts, active, capacity):
  slot, owner, fits, run = _slot_plan(p, x, gates, experts, active, capacity)

  def fallback():
    # Residuals keep the slot path's structure (zeros); the backward recomputes this branch.
    res = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(run)[1])
    return _fallback(p, x, experts, gates, active, capacity), res

  out, res = jax.lax.cond(fits, run, fallback)
  return out, (p, x, gates, experts, active, slot, owner, fits, res)


def _experts_bwd(capacity, saved, dout):
  p, x, gates, experts, active, slot, owner, fits, res = saved

  def fallback():
    _, vjp = jax.vjp(lambda p, x, g: _fallback(p, x, experts, g, active, capacity), p, x, gates)
    return vjp(dout)

  dp, dx, dgates = jax.lax.cond(
      fits, lambda: _slot_backward(p, gates, slot, owner, res, dout), fallback)
  return dp, dx, dgates, None, None


_experts.defvjp(_experts_fwd, _experts_bwd)


def slot_experts(p: dict, x: jax.Array, experts: jax.Array, gates: jax.Array, active: jax.Array,
                 capacity: int | None = None) -> jax.Array:
  """SwiGLU experts over expert-major slots (exact; an overflowing call runs `_fallback`).

  Args:
    p: {"w_gate", "w_up": `[E, d, f]`, "w_down": `[E, f, d]`}.
    x: `[tokens, d]` (compute dtype).
    experts, gates, active: `[tokens, k]` routing (int32 ids, float32 gates, bool).
    capacity: slots per expert (default `slot_capacity(tokens * k, E)`), at most `tokens`.

  Returns:
    `[tokens, d]` in x's dtype: `sum_k gate * expert(x)` over active assignments.
  """
  chex.assert_equal_shape([experts, gates, active])
  n, k = experts.shape
  num_experts = p["w_gate"].shape[0]
  # An expert receives at most one assignment per token: n slots can never overflow.
  capacity = min(capacity or slot_capacity(n * k, num_experts), n)
  w = {name: p[name] for name in ("w_gate", "w_up", "w_down")}
  return _experts(w, x, jnp.where(active, gates, 0.0), experts, active, capacity)

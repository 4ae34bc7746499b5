"""Expert parallelism: experts sharded over one mesh axis, tokens exchanged with all_to_all.

`expert_parallel_experts` runs the routed experts of one MoE layer inside a `shard_map` over the
whole mesh: tokens (flattened `[tokens, d]`) are split over every mesh axis, expert weights
`[experts, ...]` over `expert_axis` (replicated over the others). Per device:

  1. sort the local (token, choice) assignments by expert id (inactive ones last);
  2. dispatch rows to the devices owning their experts over `expert_axis`;
  3. run the local experts with a grouped matmul (`expert_fn`);
  4. send the results back (the inverse exchange) and combine them with the gate weights.

The exchange is swappable (`dispatch`):
- "dense": a padded `all_to_all` of `[ep, tokens*k, d]` buffers (worst-case sized, so dropless;
  runs on every backend, XLA:CPU included);
- "ragged": `jax.lax.ragged_all_to_all` (moves only the real rows; GPU/TPU: XLA:CPU cannot
  compile it);
- "ragged_emulated": the same offsets protocol over `all_gather`, to test "ragged" on CPU.

Routing (which experts, gate weights) is computed outside, so all implementations agree on it.
This module depends on nothing else in jaxrl_sys; the expert MLP comes in as `expert_fn`.
"""
from __future__ import annotations

import math
from typing import Callable

import chex
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

ExpertFn = Callable[[dict, jax.Array, jax.Array], jax.Array]
DISPATCHES = ("dense", "ragged", "ragged_emulated")


def _shard_map(f, mesh, in_specs, out_specs):
  if hasattr(jax, "shard_map"):
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
  from jax.experimental.shard_map import shard_map  # pylint: disable=import-outside-toplevel
  return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def context_mesh():
  """The mesh set by `with jax.set_mesh(mesh):` (or `jax.sharding.use_mesh`), else ValueError."""
  get = getattr(jax.sharding, "get_abstract_mesh", None)
  mesh = get() if get is not None else None
  if mesh is None or mesh.empty:
    raise ValueError("expert parallelism needs a mesh: call the model inside "
                     "`with jax.set_mesh(mesh):` (e.g. mesh = jaxrl_sys.sharding.make_mesh('1x8'))")
  return mesh


def _exclusive_cumsum(x):
  return jnp.cumsum(x) - x


def _dense_exchange(xs, local_ids, dest, counts, axis, n_ep, sentinel):
  """Padded all_to_all: slot `[dest, rank within dest]` of a `[ep, rows, d]` buffer."""
  n, d = xs.shape
  slot = jnp.arange(n, dtype=jnp.int32) - _exclusive_cumsum(counts)[jnp.minimum(dest, n_ep - 1)]
  send_x = jnp.zeros((n_ep, n, d), xs.dtype).at[dest, slot].set(xs, mode="drop")
  send_i = jnp.full((n_ep, n), sentinel, jnp.int32).at[dest, slot].set(local_ids, mode="drop")
  recv_x = jax.lax.all_to_all(send_x, axis, 0, 0)
  recv_i = jax.lax.all_to_all(send_i, axis, 0, 0)

  def combine(ys):
    back = jax.lax.all_to_all(ys.reshape(n_ep, n, d), axis, 0, 0)
    live = dest < n_ep
    rows = back[jnp.where(live, dest, 0), jnp.where(live, slot, 0)]
    return jnp.where(live[:, None], rows, 0)

  return recv_x.reshape(n_ep * n, d), recv_i.reshape(n_ep * n), combine


def ragged_all_to_all_emulated(operand, output, input_offsets, send_sizes, output_offsets,
                               recv_sizes, *, axis_name):
  """`jax.lax.ragged_all_to_all` semantics built from `all_gather` (any backend; test use)."""
  del recv_sizes
  me = jax.lax.axis_index(axis_name)
  ops = jax.lax.all_gather(operand, axis_name)                                   # [ep, n, ...]
  starts = jax.lax.all_gather(output_offsets, axis_name)[:, me]                 # [ep]
  sizes = jax.lax.all_gather(send_sizes, axis_name)[:, me]
  src0 = jax.lax.all_gather(input_offsets, axis_name)[:, me]
  r = jnp.arange(output.shape[0])
  hit = (r[None, :] >= starts[:, None]) & (r[None, :] < (starts + sizes)[:, None])  # [ep, rows]
  src = jnp.argmax(hit, axis=0)
  row = jnp.clip(src0[src] + r - starts[src], 0, operand.shape[0] - 1)
  vals = ops[src, row]
  keep = jnp.any(hit, axis=0).reshape((-1,) + (1,) * (output.ndim - 1))
  return jnp.where(keep, vals, output)


def _ragged_exchange(xs, local_ids, dest, counts, axis, n_ep, sentinel, a2a):
  """Ragged exchange: rows land contiguously on the receiver, ordered by source device."""
  del dest
  n, d = xs.shape
  in_off = _exclusive_cumsum(counts)
  recv_counts = jax.lax.all_to_all(counts, axis, 0, 0, tiled=True)
  recv_off = _exclusive_cumsum(recv_counts)
  out_off = jax.lax.all_to_all(recv_off, axis, 0, 0, tiled=True)    # my chunk's place on dest
  rows = n_ep * n
  recv_x = a2a(xs, jnp.zeros((rows, d), xs.dtype), in_off, counts, out_off, recv_counts,
               axis_name=axis)
  recv_i = a2a(local_ids[:, None], jnp.full((rows, 1), sentinel, jnp.int32), in_off, counts,
               out_off, recv_counts, axis_name=axis)[:, 0]
  back_off = jax.lax.all_to_all(in_off, axis, 0, 0, tiled=True)     # source's original offsets

  def combine(ys):
    return a2a(ys, jnp.zeros((n, d), ys.dtype), recv_off, recv_counts, back_off, counts,
               axis_name=axis)

  return recv_x, recv_i, combine


def _exchange(kind: str):
  if kind == "dense":
    return _dense_exchange
  if kind == "ragged":
    return lambda *a: _ragged_exchange(*a, jax.lax.ragged_all_to_all)
  if kind == "ragged_emulated":
    return lambda *a: _ragged_exchange(*a, ragged_all_to_all_emulated)
  raise ValueError(f"unknown expert-parallel dispatch {kind!r}; use one of {DISPATCHES}")


def _local_experts(w, xs, ids, num_local, expert_fn):
  """Runs `expert_fn` on received rows grouped by local expert (sentinel rows give zeros)."""
  order = jnp.argsort(ids, stable=True)
  sizes = jnp.zeros((num_local + 1,), jnp.int32).at[ids].add(1)[:num_local]
  ys = expert_fn(w, xs[order], sizes)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  return ys[inverse]


def expert_parallel_experts(p: dict, x: jax.Array, experts: jax.Array, gates: jax.Array,
                            active: jax.Array, *, expert_fn: ExpertFn, mesh=None,
                            expert_axis: str = "model", dispatch: str = "dense") -> jax.Array:
  """Routed experts of one layer with experts sharded over `expert_axis` of `mesh`.

  Args:
    p: expert weights, every leaf `[experts, ...]` (e.g. w_gate/w_up `[E, d, f]`, w_down
      `[E, f, d]`); E must be divisible by the size of `expert_axis`.
    x: `[tokens, d]` token activations (any dtype).
    experts: `[tokens, k]` int32 chosen experts.
    gates: `[tokens, k]` float32 combine weights.
    active: `[tokens, k]` bool; inactive assignments (padding, dropped) are not sent.
    expert_fn: `(p_local, rows [r, d] sorted by local expert, group_sizes [E_local]) -> [r, d]`;
      rows past `sum(group_sizes)` must come out finite (they are discarded).
    mesh: a `Mesh`/`AbstractMesh`; default: the one from `jax.set_mesh` (see `context_mesh`).
    expert_axis: mesh axis that shards the experts.
    dispatch: "dense" | "ragged" | "ragged_emulated".

  Returns:
    `[tokens, d]` in x's dtype: `sum_k gates * expert(x)`, equal to the single-device result.
  """
  chex.assert_rank(x, 2)
  chex.assert_equal_shape([experts, gates, active])
  chex.assert_axis_dimension(experts, 0, x.shape[0])
  mesh = context_mesh() if mesh is None else mesh
  if expert_axis not in mesh.axis_names:
    raise ValueError(f"expert axis {expert_axis!r} is not in the mesh axes {mesh.axis_names}")
  n_ep = int(mesh.shape[expert_axis])
  num_experts = jax.tree_util.tree_leaves(p)[0].shape[0]
  if num_experts % n_ep:
    raise ValueError(f"{num_experts} experts cannot be split over {n_ep} devices of mesh axis "
                     f"{expert_axis!r}")
  num_local = num_experts // n_ep
  exchange = _exchange(dispatch)
  token_axes = tuple(mesh.axis_names)
  shards = math.prod(int(mesh.shape[a]) for a in token_axes)
  t = x.shape[0]
  pad = (-t) % shards
  if pad:
    x = jnp.pad(x, ((0, pad), (0, 0)))
    experts, gates = jnp.pad(experts, ((0, pad), (0, 0))), jnp.pad(gates, ((0, pad), (0, 0)))
    active = jnp.pad(active, ((0, pad), (0, 0)))

  def body(w, x, experts, gates, active):
    tl, k = experts.shape
    flat = jnp.where(active, experts, num_experts).reshape(-1).astype(jnp.int32)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    ids = flat[order]
    dest = ids // num_local                                   # n_ep for inactive assignments
    counts = jnp.zeros((n_ep + 1,), jnp.int32).at[dest].add(1)[:n_ep]
    local_ids = jnp.where(dest < n_ep, ids - dest * num_local, num_local)
    xs = x[order // k]
    recv_x, recv_i, combine = exchange(xs, local_ids, dest, counts, expert_axis, n_ep, num_local)
    ys = combine(_local_experts(w, recv_x, recv_i, num_local, expert_fn))   # [tl*k, d], sorted
    ys = ys * gates.reshape(-1)[order][:, None].astype(ys.dtype)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(tl * k, dtype=order.dtype))
    return jnp.sum(ys[inverse].reshape(tl, k, -1), axis=1).astype(x.dtype)

  tok = P(token_axes)
  w_specs = jax.tree_util.tree_map(lambda _: P(expert_axis), p)
  out = _shard_map(body, mesh, (w_specs, tok, tok, tok, tok), tok)(p, x, experts, gates, active)
  return out[:t]

"""Routed-expert computation: dense einsum reference and dropless grouped matmul (ragged_dot).

Expert weights of one layer: `w_gate`, `w_up` `[experts, d, f]`, `w_down` `[experts, f, d]`.
Each expert is a SwiGLU MLP. Both implementations take the routing of flattened tokens
(`experts`, `gates`, `active`, each `[tokens, k]`) and return `sum_k gate * expert(x)`.
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp


@functools.lru_cache(maxsize=1)
def _kernel_gmm():
  """`jaxrl_sys.kernels.grouped_matmul` when that kernel is present, else None."""
  try:
    from jaxrl_sys.kernels.grouped_matmul import grouped_matmul  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return grouped_matmul


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                   impl: str = "xla") -> jax.Array:
  """Per-group matmul: rows of `lhs [rows, a]` grouped consecutively by `group_sizes [groups]`
  times `rhs [groups, a, b]` -> `[rows, b]` (rows past `sum(group_sizes)` are zero).

  Goes through `jaxrl_sys.kernels.grouped_matmul(..., impl=impl)` when available, otherwise
  `jax.lax.ragged_dot` (same semantics).
  """
  kernel = _kernel_gmm()
  if kernel is not None:
    return kernel(lhs, rhs, group_sizes, impl=impl)
  return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32))


def adapter_einsum(ad, x: jax.Array, eq_a: str, eq_b: str) -> jax.Array:
  """An expert adapter's term `scale * (drop(x) @ A_e) @ B_e` by two einsums (`eq_a` contracts
  x with A `[E, in, r]`, `eq_b` the result with B `[E, r, out]`)."""
  dt = x.dtype
  h = jnp.einsum(eq_a, ad.drop(x), ad.a.astype(dt))
  return jnp.einsum(eq_b, h * jnp.asarray(ad.scale, dt), ad.b.astype(dt))


def dense_experts(p: dict, x: jax.Array, experts: jax.Array, gates: jax.Array,
                  adapters: dict | None = None) -> jax.Array:
  """Reference: every expert on every token, combined by a `[tokens, experts]` weight matrix.

  Args:
    p: {"w_gate", "w_up": `[E, d, f]`, "w_down": `[E, f, d]`}.
    x: `[tokens, d]` (compute dtype).
    experts: `[tokens, k]` int32.
    gates: `[tokens, k]` float32, zero for inactive assignments.
    adapters: LoRA adapters by weight name (`models.lora.Adapter`, A `[E, in, r]`, B
      `[E, r, out]`), or None.

  Returns:
    `[tokens, d]` in x's dtype.
  """
  dt = x.dtype
  ad = adapters or {}
  num_experts = p["w_gate"].shape[0]
  combine = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32) * gates[..., None],
                    axis=1)                                                    # [tokens, E]
  g = jnp.einsum("td,edf->etf", x, p["w_gate"].astype(dt))
  u = jnp.einsum("td,edf->etf", x, p["w_up"].astype(dt))
  if "w_gate" in ad:
    g = g + adapter_einsum(ad["w_gate"], x, "td,edr->etr", "etr,erf->etf")
  if "w_up" in ad:
    u = u + adapter_einsum(ad["w_up"], x, "td,edr->etr", "etr,erf->etf")
  h = jax.nn.silu(g) * u
  y = jnp.einsum("etf,efd->etd", h, p["w_down"].astype(dt))
  if "w_down" in ad:
    y = y + adapter_einsum(ad["w_down"], h, "etf,efr->etr", "etr,erd->etd")
  return jnp.einsum("te,etd->td", combine.astype(dt), y)


def sort_by_expert(experts: jax.Array, active: jax.Array, num_experts: int):
  """Orders the flattened assignments by expert, inactive ones last.

  Args:
    experts: `[tokens, k]` int32.
    active: `[tokens, k]` bool.
    num_experts: E.

  Returns:
    (order `[tokens*k]` int32 permutation of flat assignment indices, group_sizes `[E]` int32,
    sorted ids `[tokens*k]` int32 with E for inactive assignments).
  """
  flat = jnp.where(active, experts, num_experts).reshape(-1).astype(jnp.int32)
  order = jnp.argsort(flat, stable=True).astype(jnp.int32)
  sizes = jnp.zeros((num_experts + 1,), jnp.int32).at[flat].add(1)[:num_experts]
  return order, sizes, flat[order]


def gather_rows(a: jax.Array, index: jax.Array) -> jax.Array:
  """`a [m, d]` rows at `index` (any int shape), where index `m` reads a zero row (padding,
  empty slots, inactive assignments)."""
  return jnp.concatenate([a, jnp.zeros((1, a.shape[1]), a.dtype)])[index]


def place_sorted(order: jax.Array, sorted_ids: jax.Array, sizes: jax.Array, first_row: jax.Array,
                 limit: int, rows: int):
  """Rows of a `[rows, ...]` buffer for the assignments of `sort_by_expert`: expert e's i-th
  assignment (in token order) goes to row `first_row[e] + i` when `i < limit`.

  Returns:
    (row `[A]` int32 per flat assignment, `rows` = none: inactive or over the limit; owner
    `[rows]` int32 assignment of each row, `A` = empty).
  """
  a, num_experts = order.shape[0], sizes.shape[0]
  e = jnp.minimum(sorted_ids, num_experts - 1)
  rank = jnp.arange(a, dtype=jnp.int32) - (jnp.cumsum(sizes) - sizes)[e]
  ok = (sorted_ids < num_experts) & (rank < limit)
  dest = jnp.where(ok, first_row[e] + rank, rows).astype(jnp.int32)
  row = jnp.zeros((a,), jnp.int32).at[order].set(dest, unique_indices=True)
  owner = jnp.full((rows + 1,), a, jnp.int32).at[row].set(jnp.arange(a, dtype=jnp.int32))[:rows]
  return row, owner


def swiglu_grouped(p: dict, xs: jax.Array, group_sizes: jax.Array, impl: str = "xla",
                   adapters: dict | None = None) -> jax.Array:
  """SwiGLU experts on rows `xs [rows, d]` sorted by expert with `group_sizes [E]`; LoRA
  `adapters` by weight name add `scale * (x @ A_e) @ B_e` as two grouped matmuls each."""
  dt = xs.dtype
  ad = adapters or {}

  def mm(a, name):
    y = grouped_matmul(a, p[name].astype(dt), group_sizes, impl)
    if name not in ad:
      return y
    h = grouped_matmul(ad[name].drop(a), ad[name].a.astype(dt), group_sizes, impl)
    return y + grouped_matmul(h * jnp.asarray(ad[name].scale, dt), ad[name].b.astype(dt),
                              group_sizes, impl)

  return mm(jax.nn.silu(mm(xs, "w_gate")) * mm(xs, "w_up"), "w_down")


def ragged_experts(p: dict, x: jax.Array, experts: jax.Array, gates: jax.Array, active: jax.Array,
                   impl: str = "xla", adapters: dict | None = None) -> jax.Array:
  """Dropless grouped-matmul experts: sort assignments by expert, one ragged matmul per weight.

  Inactive assignments (padding, dropped) are sorted past the groups and cost nothing.

  Args:
    p: expert weights (see `dense_experts`).
    x: `[tokens, d]`.
    experts, gates, active: `[tokens, k]` routing.
    impl: grouped-matmul implementation.
    adapters: LoRA adapters by weight name (see `dense_experts`), or None.

  Returns:
    `[tokens, d]` in x's dtype.
  """
  chex.assert_equal_shape([experts, gates, active])
  t, k = experts.shape
  num_experts = p["w_gate"].shape[0]
  order, sizes, _ = sort_by_expert(experts, active, num_experts)
  xs = x[order // k]                                                           # [t*k, d]
  ys = swiglu_grouped(p, xs, sizes, impl, adapters)
  ys = ys * gates.reshape(-1)[order][:, None].astype(ys.dtype)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(t * k, dtype=order.dtype))
  return jnp.sum(ys[inverse].reshape(t, k, -1), axis=1)

"""MoE routing as pure functions: router scores, biased top-k, BIP dual sweeps, capacity, losses.

All functions work on flattened tokens: `scores [tokens, experts]` float32, `valid [tokens]` bool
(False = padding, which never counts in loads, capacities, duals or losses).

Balancing methods (spec/algorithms.md sections 4, 5):
- aux-free: experts are chosen by top-k of `scores + bias`; gate weights come from the unbiased
  scores, so the bias changes only *which* experts are used.
- BIP: a per-layer dual vector q (one entry per expert) is refined by a few block-coordinate
  sweeps on the dual of the LP relaxation of

      max sum_ij s_ij x_ij  s.t.  sum_j x_ij = k,  sum_i x_ij <= c = ceil(k n / m),  x in {0, 1}

  and experts are chosen by top-k of `scores - q`. Per sweep:
      p_i <- max(0, (k+1)-th largest of {s_ij - q_j}_j)
      q_j <- max(0, rule({s_ij - p_i}_i))   with rule = midpoint of the c-th and (c+1)-th largest
                                            ("midpoint") or the (c+1)-th largest + 1e-4 ("kth").
  The capacity uses ceil (not floor) so that exact-k routing can be feasible.

Batch routing and per-token routing (`route(..., per_token=...)`): the BIP sweeps and the
capacity limit look at the whole batch, so a token's experts depend on its batch-mates. Training
routes the batch that way; inference (prefill and decode, `per_token=True`) chooses top-k of the
scores shifted by the *stored* state only (aux-free bias, BIP duals q without sweeps) and drops
nothing, so a token's experts depend on its own scores and the policy's state alone.

Replay (`replay`): recorded experts are imposed on chosen tokens; their gates are recomputed
from the live scores at the forced experts (so router gradients flow), and the load (hence the
aux loss and the aux-free bias update) counts the replayed assignment.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

_NEG = -1e9          # "minus infinity" for masked scores (scores are O(1))
KTH_MARGIN = 1e-4    # margin added to binding q_j under the "kth" rule


class Routing(NamedTuple):
  """Result of routing one batch of tokens.

  experts: `[tokens, k]` int32 chosen expert ids.
  gates: `[tokens, k]` float32 combine weights (0 for padding and dropped assignments).
  active: `[tokens, k]` bool, the assignment is computed (valid token and not dropped).
  load: `[experts]` float32 number of routed assignments of valid tokens (before dropping).
  dropped: `[]` float32 number of valid assignments dropped by the capacity limit.
  q: `[experts]` float32 BIP duals after this batch's sweeps (the input q otherwise).
  """
  experts: jax.Array
  gates: jax.Array
  active: jax.Array
  load: jax.Array
  dropped: jax.Array
  q: jax.Array


def router_scores(logits: jax.Array, gating: str) -> jax.Array:
  """`logits [tokens, experts]` -> float32 affinities (softmax over experts, or sigmoid)."""
  logits = logits.astype(jnp.float32)
  if gating == "softmax":
    return jax.nn.softmax(logits, axis=-1)
  if gating == "sigmoid":
    return jax.nn.sigmoid(logits)
  raise ValueError(f"unknown gating {gating!r}")


def bip_capacity(num_valid: jax.Array, k: int, num_experts: int) -> jax.Array:
  """Per-expert BIP capacity `ceil(k * n / m)` as int32 (n = number of valid tokens)."""
  return ((num_valid.astype(jnp.int32) * k + num_experts - 1) // num_experts).astype(jnp.int32)


def _kth_largest_rows(x: jax.Array, kth: int) -> jax.Array:
  """`kth`-largest (1-based) along the last axis; `_NEG` when the row is shorter."""
  if kth > x.shape[-1]:
    return jnp.full(x.shape[:-1], _NEG, x.dtype)
  return jax.lax.top_k(x, kth)[0][..., kth - 1]


def bip_sweeps(scores: jax.Array, valid: jax.Array, q0: jax.Array, k: int, iterations: int,
               rule: str = "midpoint") -> jax.Array:
  """Runs `iterations` dual sweeps of BIP balancing, warm-started from `q0`.

  Args:
    scores: `[tokens, experts]` float32 routing scores (no gradient is taken).
    valid: `[tokens]` bool; padding rows are ignored.
    q0: `[experts]` float32 duals from the previous step (zeros on a cold start).
    k: experts per token.
    iterations: number of (p, q) sweeps (static).
    rule: "midpoint" or "kth" (see the module docstring).

  Returns:
    `[experts]` float32 duals q >= 0. Only differences q_j - q_j' affect routing.
  """
  chex.assert_rank(scores, 2)
  chex.assert_shape(valid, scores.shape[:1])
  chex.assert_shape(q0, scores.shape[1:])
  s = jax.lax.stop_gradient(scores.astype(jnp.float32))
  q0 = jax.lax.stop_gradient(q0.astype(jnp.float32))
  n, m = s.shape
  num_valid = jnp.sum(valid.astype(jnp.int32))
  cap = jnp.clip(bip_capacity(num_valid, k, m), 1, n)
  sentinel = jnp.full((1, m), _NEG, jnp.float32)

  def sweep(q, _):
    p = jnp.maximum(0.0, _kth_largest_rows(s - q[None, :], k + 1))                 # [tokens]
    a = jnp.where(valid[:, None], s - p[:, None], _NEG)                            # [tokens, m]
    desc = jnp.concatenate([-jnp.sort(-a, axis=0), sentinel], axis=0)             # [tokens+1, m]
    v_c1 = jax.lax.dynamic_index_in_dim(desc, cap, axis=0, keepdims=False)        # (c+1)-th
    if rule == "midpoint":
      v_c = jax.lax.dynamic_index_in_dim(desc, cap - 1, axis=0, keepdims=False)   # c-th
      q_new = jnp.maximum(0.0, 0.5 * (v_c + v_c1))
    elif rule == "kth":
      q_new = jnp.where(v_c1 > 0.0, v_c1 + KTH_MARGIN, 0.0)
    else:
      raise ValueError(f"unknown BIP rule {rule!r}")
    return jnp.where(num_valid > 0, q_new, q), None

  q, _ = jax.lax.scan(sweep, q0, None, length=iterations)
  return q


def capacity_keep(experts: jax.Array, valid: jax.Array, num_experts: int,
                  capacity_factor: float) -> jax.Array:
  """Which assignments fit the per-expert capacity `ceil(cf * k * n_valid / m)`.

  Priority: all first choices (in token order), then all second choices, and so on.

  Args:
    experts: `[tokens, k]` int32 chosen experts.
    valid: `[tokens]` bool.
    num_experts: m.
    capacity_factor: cf > 0.

  Returns:
    `[tokens, k]` bool, True for kept assignments of valid tokens.
  """
  t, k = experts.shape
  num_valid = jnp.sum(valid.astype(jnp.float32))
  cap = jnp.ceil(capacity_factor * k * num_valid / num_experts)
  flat = experts.T.reshape(-1)                                                  # choice-major
  live = jnp.tile(valid, k)
  onehot = jax.nn.one_hot(flat, num_experts, dtype=jnp.int32) * live[:, None].astype(jnp.int32)
  position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)       # queue slot
  keep = live & (position.astype(jnp.float32) < cap)
  return keep.reshape(k, t).T


def expert_load(experts: jax.Array, mask: jax.Array, num_experts: int) -> jax.Array:
  """`[experts]` float32 count of assignments `experts [tokens, k]` where `mask [tokens, k]`."""
  w = mask.astype(jnp.float32).reshape(-1)
  return jnp.zeros((num_experts,), jnp.float32).at[experts.reshape(-1)].add(w)


def route(scores: jax.Array, valid: jax.Array, *, k: int, norm_topk_prob: bool,
          routed_scaling_factor: float = 1.0, balancing: str = "none",
          bias: jax.Array | None = None, q: jax.Array | None = None, bip_iterations: int = 0,
          bip_rule: str = "midpoint", capacity_factor: float = 0.0,
          per_token: bool = False) -> Routing:
  """Chooses k experts per token and their gate weights.

  Args:
    scores: `[tokens, experts]` float32 router affinities (differentiable).
    valid: `[tokens]` bool, False for padding.
    k: experts per token.
    norm_topk_prob: renormalise the k chosen scores to sum to 1.
    routed_scaling_factor: multiplies the gate weights.
    balancing: "none" | "aux_loss" | "aux_free" | "bip".
    bias: `[experts]` aux-free selection bias (aux_free only; None = zeros).
    q: `[experts]` stored BIP duals (bip only; None = zeros, a cold start).
    bip_iterations: BIP sweeps on this batch.
    bip_rule: "midpoint" | "kth".
    capacity_factor: 0 = dropless, else drop assignments beyond the capacity.
    per_token: route every token on its own (inference): no BIP sweeps (the stored q steers
      the selection and comes back unchanged) and no capacity limit, so the result for a token
      does not depend on the other tokens.

  Returns:
    A `Routing`.
  """
  chex.assert_rank(scores, 2)
  chex.assert_shape(valid, scores.shape[:1])
  n, m = scores.shape
  valid = valid.astype(bool)
  zeros = jnp.zeros((m,), jnp.float32)
  q_in = zeros if q is None else jax.lax.stop_gradient(q.astype(jnp.float32))
  q_out = q_in
  select = jax.lax.stop_gradient(scores)
  if balancing == "aux_free" and bias is not None:
    select = select + jax.lax.stop_gradient(bias.astype(jnp.float32))[None, :]
  elif balancing == "bip":
    if bip_iterations > 0 and not per_token:
      q_out = bip_sweeps(scores, valid, q_in, k, bip_iterations, bip_rule)
    select = select - q_out[None, :]
  _, experts = jax.lax.top_k(select, k)
  experts = experts.astype(jnp.int32)
  live = jnp.broadcast_to(valid[:, None], experts.shape)
  active = live
  if capacity_factor > 0 and not per_token:
    active = capacity_keep(experts, valid, m, capacity_factor)
  return _routing(scores, valid, experts, active, q_out, norm_topk_prob, routed_scaling_factor)


def _routing(scores, valid, experts, active, q, norm_topk_prob: bool,
             routed_scaling_factor: float) -> Routing:
  """The `Routing` of the assignment `experts`/`active`: gates from the unbiased live scores."""
  m = scores.shape[-1]
  gates = jnp.take_along_axis(scores, experts, axis=-1)                          # unbiased
  if norm_topk_prob:
    gates = gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-20)
  gates = gates * routed_scaling_factor
  gates = jnp.where(active, gates, 0.0)
  live = jnp.broadcast_to(valid[:, None], experts.shape)
  load = expert_load(experts, live, m)
  dropped = jnp.sum(live.astype(jnp.float32)) - jnp.sum(active.astype(jnp.float32))
  return Routing(experts, gates, active, load, dropped, q)


def replay(live: Routing, scores: jax.Array, valid: jax.Array, experts: jax.Array,
           forced: jax.Array, active: jax.Array | None = None, *, norm_topk_prob: bool,
           routed_scaling_factor: float = 1.0) -> tuple[Routing, jax.Array]:
  """Imposes recorded experts on the `forced` tokens; the others keep the live routing.

  Args:
    live: the routing this batch would get (`route` on the same scores): kept where not forced,
      and its BIP duals `q` (a function of the scores alone) are passed on.
    scores: `[tokens, experts]` float32 live router affinities (differentiable).
    valid: `[tokens]` bool, False for padding.
    experts: `[tokens, k]` integer recorded expert ids, in the order they were chosen (the
      gate sum then runs in the recorded order).
    forced: `[tokens]` bool, tokens whose routes are imposed.
    active: `[tokens, k]` bool recorded assignments that were computed (False = dropped by a
      capacity limit); None = every assignment of a valid token.
    norm_topk_prob, routed_scaling_factor: as for `route`.

  Returns:
    (the `Routing`: gates gathered from the live scores at the forced experts, so the router
    gets gradients; load and dropped count the replayed assignment; q = live.q,
    agree `[]` float32: forced assignments of valid tokens that the live routing also chose).
  """
  chex.assert_equal_shape([live.experts, experts])
  chex.assert_shape(forced, valid.shape)
  forced = forced.astype(bool) & valid.astype(bool)
  rec = experts.astype(jnp.int32)
  rec_active = jnp.broadcast_to(valid[:, None], rec.shape) if active is None else (
      active.astype(bool) & valid[:, None])
  chosen = jnp.where(forced[:, None], rec, live.experts)
  act = jnp.where(forced[:, None], rec_active, live.active)
  same = jnp.any(rec[:, :, None] == live.experts[:, None, :], axis=-1) & forced[:, None]
  out = _routing(scores, valid, chosen, act, live.q, norm_topk_prob, routed_scaling_factor)
  return out, jnp.sum(same.astype(jnp.float32))


def route_dtype(num_experts: int):
  """The compact dtype of recorded expert ids: uint8 up to 256 experts, else uint16."""
  if num_experts <= 256:
    return jnp.uint8
  if num_experts <= 65536:
    return jnp.uint16
  raise ValueError(f"{num_experts} experts do not fit a uint16 route record")


def switch_aux_loss(scores: jax.Array, routing: Routing, valid: jax.Array, k: int) -> jax.Array:
  """Switch/GShard load-balancing loss in its top-k form, `m * sum_j f_j P_j` (1 when balanced).

  f_j = load_j / (k * n_valid) (no gradient), P_j = mean over valid tokens of the normalised
  score of expert j (softmax probabilities; sigmoid scores are normalised per token).

  Returns:
    `[]` float32, to be multiplied by the coefficient.
  """
  m = scores.shape[-1]
  w = valid.astype(jnp.float32)[:, None]
  n = jnp.maximum(jnp.sum(w), 1.0)
  probs = scores / (jnp.sum(scores, axis=-1, keepdims=True) + 1e-20)
  frac = jax.lax.stop_gradient(routing.load) / (k * n)
  mean_prob = jnp.sum(probs * w, axis=0) / n
  return m * jnp.sum(frac * mean_prob)


def max_violation(load: jax.Array) -> jax.Array:
  """MaxVio = max_j c_j / mean_j c_j - 1 over the last axis (0 when there is no load)."""
  mean = jnp.mean(load, axis=-1)
  return jnp.where(mean > 0, jnp.max(load, axis=-1) / jnp.maximum(mean, 1e-20) - 1.0, 0.0)


def aux_free_bias_update(bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
  """`b_j <- b_j + u * sign(mean_j c_j - c_j)` over the last axis (`[..., experts]`)."""
  load = load.astype(jnp.float32)
  return bias + rate * jnp.sign(jnp.mean(load, axis=-1, keepdims=True) - load)


def static_capacity(num_tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
  """Host-side capacity for `num_tokens` valid tokens (as `capacity_keep` computes it)."""
  return int(math.ceil(capacity_factor * k * num_tokens / num_experts))

"""Mixture-of-Experts feed-forward block with load balancing state and metrics.

DeepSeek-V3 / Qwen3-MoE style: fine-grained routed SwiGLU experts, optional shared experts
(fused into one MLP, optionally behind a Qwen2-MoE sigmoid gate), softmax or sigmoid gating,
top-k with optional renormalisation and a routed scaling factor, capacity-factor dropping or
dropless. Implementations (`MoEConfig.implementation`): "ragged" (grouped matmul via
`jax.lax.ragged_dot`), "slots" (expert-major slot buffers, one batched GEMM on the weights as
they are, an exact fallback on overflow; `models/moe/slots.py`), "segments" (expert-sorted
segments walked in blocks, one GEMM per block on its expert's weights, exact with no capacity;
`models/moe/segments.py`), "blocked" (expert-sorted row blocks, one batched GEMM over gathered
weights; `models/moe/blocked.py`), "auto" (on CPU slots at decode sizes and segments at
training sizes; ragged on GPU/TPU), "dense" (einsum over all experts, the reference) and
"expert_parallel" (shard_map + all_to_all over a mesh axis; needs `with jax.set_mesh(mesh):`).

Parameters of the MoE layers (L layers, E experts, D hidden, F expert width, S shared width):
  router [L, D, E]; w_gate, w_up [L, E, D, F]; w_down [L, E, F, D]
  shared.{w_gate, w_up [L, D, S], w_down [L, S, D]}     (num_shared_experts > 0)
  shared_gate [L, D, 1]                                   (shared_expert_gate)

Inference routes every token on its own (`per_token=True`, what `forward` does with a KV
cache): top-k with the stored balancing state (aux-free bias, BIP duals without sweeps), no
capacity drop, so a request's experts do not depend on its batch-mates. Training routes the
batch (BIP sweeps, capacity) or replays recorded routes (`forced`, `models.moe.replay`).

Balancing state (`MoEState`, not trained) is threaded by the trainer:
  state = init_moe_state(config)
  out = forward(params, config, tokens, ..., moe_state=state)    # out.aux: per-layer stats
  loss = task_loss + moe_aux_loss(out.aux)                        # non-zero for "aux_loss" only
  state = update_moe_state(state, out.aux, config)                # inside the jitted step
  metrics |= moe_metrics(out.aux)
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_sys import backend
from jaxrl_sys.models.moe import blocked as moe_blocked
from jaxrl_sys.models.moe import experts as moe_experts
from jaxrl_sys.models.moe import routing as moe_routing
from jaxrl_sys.models.moe import segments as moe_segments
from jaxrl_sys.models.moe import slots as moe_slots
from jaxrl_sys.models.config import ModelConfig, MoEConfig
from jaxrl_sys.models.moe.routing import max_violation
from jaxrl_sys.sharding.axes import EMBED, EXPERT, EXPERT_MLP, LAYERS, MLP


class MoEState(NamedTuple):
  """Per-layer balancing state, float32, stacked on `[layers]`; no gradient flows into it.

  bias: `[layers, experts]` aux-free selection bias.
  q: `[layers, experts]` BIP dual vector (warm start of the next step's sweeps).
  """
  bias: jax.Array
  q: jax.Array


def _moe(config: ModelConfig) -> MoEConfig:
  if config.moe is None:
    raise ValueError("ModelConfig.moe is None: this is a dense model")
  return config.moe


def init_moe_state(config: ModelConfig) -> MoEState:
  """Zero bias and duals for every MoE layer. Checkpoint it with the train state."""
  m = _moe(config)
  z = jnp.zeros((config.num_layers, m.num_experts), jnp.float32)
  return MoEState(bias=z, q=z)


def moe_state_axes(config: ModelConfig) -> MoEState:
  """Logical axes of `MoEState` (replicated: layers and experts are tiny vectors)."""
  del config
  return MoEState(bias=(LAYERS, None), q=(LAYERS, None))


def _normal(key, shape, dtype, std=0.02):
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def init_moe_params(config: ModelConfig, key: jax.Array) -> dict:
  """Random MoE parameters for all layers (normal std 0.02), in `config.param_dtype`."""
  m, dt = _moe(config), config.pdtype
  L, D, E, F, S = (config.num_layers, config.hidden_size, m.num_experts,
                   m.expert_intermediate_size, m.shared_width)
  ks = jax.random.split(key, 8)
  p = {"router": _normal(ks[0], (L, D, E), dt), "w_gate": _normal(ks[1], (L, E, D, F), dt),
       "w_up": _normal(ks[2], (L, E, D, F), dt), "w_down": _normal(ks[3], (L, E, F, D), dt)}
  if S:
    p["shared"] = {"w_gate": _normal(ks[4], (L, D, S), dt), "w_up": _normal(ks[5], (L, D, S), dt),
                   "w_down": _normal(ks[6], (L, S, D), dt)}
    if m.shared_expert_gate:
      p["shared_gate"] = _normal(ks[7], (L, D, 1), dt)
  return p


def moe_param_axes(config: ModelConfig) -> dict:
  """Logical axis names of `init_moe_params` (experts over "expert", i.e. the model axis)."""
  m = _moe(config)
  axes = {"router": (LAYERS, EMBED, None),
          "w_gate": (LAYERS, EXPERT, EMBED, EXPERT_MLP),
          "w_up": (LAYERS, EXPERT, EMBED, EXPERT_MLP),
          "w_down": (LAYERS, EXPERT, EXPERT_MLP, EMBED)}
  if m.shared_width:
    axes["shared"] = {"w_gate": (LAYERS, EMBED, MLP), "w_up": (LAYERS, EMBED, MLP),
                      "w_down": (LAYERS, MLP, EMBED)}
    if m.shared_expert_gate:
      axes["shared_gate"] = (LAYERS, EMBED, None)
  return axes


def resolve_implementation(implementation: str, tokens: int, num_experts: int) -> str:
  """The implementation a layer of `tokens` rows over `num_experts` experts runs.

  "auto" -> "ragged" on GPU/TPU. On CPU (where XLA runs a ragged matmul as one dense matmul per
  expert) "slots" up to `moe_slots.DENSE_FALLBACK_ROWS` token x expert rows (decode steps: the
  slots' one batched GEMM beats a loop of small chunks), "segments" above (training and prefill:
  exact work for any routing, where a skewed router would overflow the slots). Any other
  implementation is returned as it is."""
  return backend.moe_implementation(implementation, tokens, num_experts,
                                    slots_max_rows=moe_slots.DENSE_FALLBACK_ROWS)


def routed_experts(p: dict, x: jax.Array, routing: moe_routing.Routing, m: MoEConfig) -> jax.Array:
  """Runs the routed experts of one layer with `m.implementation`. `x [tokens, D]` -> same."""
  w = {k: p[k] for k in ("w_gate", "w_up", "w_down")}
  impl = resolve_implementation(m.implementation, x.shape[0], m.num_experts)
  if impl == "dense":
    return moe_experts.dense_experts(w, x, routing.experts, routing.gates)
  if impl == "slots":
    return moe_slots.slot_experts(w, x, routing.experts, routing.gates, routing.active)
  if impl == "segments":
    return moe_segments.segment_experts(w, x, routing.experts, routing.gates, routing.active)
  if impl == "blocked":
    return moe_blocked.blocked_experts(w, x, routing.experts, routing.gates, routing.active)
  if impl == "ragged":
    return moe_experts.ragged_experts(w, x, routing.experts, routing.gates, routing.active,
                                      m.grouped_matmul_impl)
  from jaxrl_sys.sharding import expert_parallel  # pylint: disable=import-outside-toplevel

  def expert_fn(wl, rows, sizes):
    return moe_experts.swiglu_grouped(wl, rows, sizes, m.grouped_matmul_impl)

  return expert_parallel.expert_parallel_experts(
      w, x, routing.experts, routing.gates, routing.active, expert_fn=expert_fn,
      expert_axis=m.expert_axis, dispatch=m.ep_dispatch)


def _shared(p: dict, x: jax.Array, m: MoEConfig) -> jax.Array:
  dt = x.dtype
  s = p["shared"]
  h = jax.nn.silu(x @ s["w_gate"].astype(dt)) * (x @ s["w_up"].astype(dt))
  y = h @ s["w_down"].astype(dt)
  if m.shared_expert_gate:
    y = y * jax.nn.sigmoid(x @ p["shared_gate"].astype(dt))
  return y


class Forced(NamedTuple):
  """Recorded routes imposed on one layer (see `models.moe.replay`).

  experts: `[batch, seq, k]` integer expert ids; mask: `[batch, seq]` bool tokens that are
  forced (the others route live); active: `[batch, seq, k]` bool computed assignments, or None
  (every assignment of a real token).
  """
  experts: jax.Array
  mask: jax.Array
  active: jax.Array | None = None


def moe_block(p: dict, h: jax.Array, config: ModelConfig, lstate: MoEState | None = None, *,
              token_mask: jax.Array | None = None, forced: Forced | None = None,
              per_token: bool = False, return_experts: bool = False) -> tuple[jax.Array, dict]:
  """One MoE feed-forward layer.

  Args:
    p: this layer's MoE parameters (`init_moe_params` without the leading layers axis).
    h: `[batch, seq, D]` normed hidden states (compute dtype).
    config: model config with `moe` set (static).
    lstate: this layer's `MoEState` slice (bias `[E]`, q `[E]`), or None (zeros).
    token_mask: `[batch, seq]` 1 for real tokens, 0 for padding (default all real).
    forced: recorded routes to replay (`Forced`), or None (route live).
    per_token: route every token on its own with the stored balancing state (inference: no BIP
      sweeps, no capacity drop; `routing.route`); False routes the batch (training).
    return_experts: also return the routing in aux (below).

  Returns:
    (out `[batch, seq, D]` in h's dtype, aux) with aux float32 entries
      load `[E]` routed assignments per expert (valid tokens, before dropping),
      dropped `[]` assignments dropped by the capacity, assignments `[]` valid assignments,
      aux_loss `[]` coefficient-weighted Switch loss (0 unless balancing == "aux_loss"),
      q `[E]` BIP duals after this batch's sweeps (input q otherwise),
      and with `forced`: replay_agree `[]` forced assignments of real tokens the live routing
      also chose, replayed `[]` forced assignments of real tokens;
      with `return_experts`: experts `[batch, seq, k]` int32 and active `[batch, seq, k]` bool.
  """
  m = _moe(config)
  chex.assert_rank(h, 3)
  b, t, d = h.shape
  x = h.reshape(b * t, d)
  valid = (jnp.ones((b * t,), bool) if token_mask is None
           else token_mask.reshape(b * t).astype(bool))
  logits = jnp.einsum("td,de->te", x.astype(jnp.float32), p["router"].astype(jnp.float32))
  scores = moe_routing.router_scores(logits, m.gating)
  k = m.num_experts_per_tok
  routing = moe_routing.route(
      scores, valid, k=k, norm_topk_prob=m.norm_topk_prob,
      routed_scaling_factor=m.routed_scaling_factor, balancing=m.balancing,
      bias=None if lstate is None else lstate.bias, q=None if lstate is None else lstate.q,
      bip_iterations=m.bip_iterations, bip_rule=m.bip_rule, capacity_factor=m.capacity_factor,
      per_token=per_token)
  replay_aux = {}
  if forced is not None:
    chex.assert_shape(forced.experts, (b, t, k))
    routing, agree = moe_routing.replay(
        routing, scores, valid, forced.experts.reshape(b * t, k), forced.mask.reshape(b * t),
        None if forced.active is None else forced.active.reshape(b * t, k),
        norm_topk_prob=m.norm_topk_prob, routed_scaling_factor=m.routed_scaling_factor)
    replayed = jnp.sum((forced.mask.reshape(b * t).astype(bool) & valid).astype(jnp.float32))
    replay_aux = {"replay_agree": agree, "replayed": replayed * k}
  out = routed_experts(p, x, routing, m)
  if m.shared_width:
    out = out + _shared(p, x, m)
  aux_loss = jnp.zeros((), jnp.float32)
  if m.balancing == "aux_loss":
    aux_loss = m.aux_loss_coef * moe_routing.switch_aux_loss(scores, routing, valid, k)
  aux = {"load": routing.load, "dropped": routing.dropped,
         "assignments": jnp.sum(valid.astype(jnp.float32)) * k,
         "aux_loss": aux_loss, "q": routing.q, **replay_aux}
  if return_experts:
    aux["experts"] = routing.experts.reshape(b, t, k)
    aux["active"] = routing.active.reshape(b, t, k)
  return out.reshape(b, t, d).astype(h.dtype), aux


def moe_aux_loss(aux: dict) -> jax.Array:
  """Total auxiliary loss to add to the training loss: the sum over MoE layers (0 if dense)."""
  if "aux_loss" not in aux:
    return jnp.zeros((), jnp.float32)
  return jnp.sum(aux["aux_loss"])


def update_moe_state(state: MoEState, aux: dict, config: ModelConfig) -> MoEState:
  """Balancing-state update after a step (pure; call it inside the jitted train step).

  aux-free: `bias += u * sign(mean_j load_j - load_j)` per layer, with `aux["load"]` `[L, E]`
  (sum the loads of all micro-batches of the step first when accumulating gradients).
  BIP: `q <- aux["q"]` (the duals the forward's sweeps produced). Otherwise unchanged.
  """
  m = _moe(config)
  chex.assert_shape(state.bias, (config.num_layers, m.num_experts))
  aux = jax.lax.stop_gradient({k: aux[k] for k in ("load", "q")})
  if m.balancing == "aux_free":
    bias = moe_routing.aux_free_bias_update(state.bias, aux["load"], m.bias_update_rate)
    return state._replace(bias=bias)
  if m.balancing == "bip":
    chex.assert_equal_shape([state.q, aux["q"]])
    return state._replace(q=aux["q"].astype(jnp.float32))
  return state


def moe_metrics(aux: dict) -> dict:
  """Load-balance metrics from the stacked `aux` of a forward (empty dict for dense models).

  Returns float32 entries: "moe/avg_maxvio" (mean over layers of MaxVio), "moe/sup_maxvio"
  (max over layers), "moe/maxvio" `[L]`, "moe/load" `[L, E]` (histogram), "moe/dropped_frac"
  (dropped / valid assignments over all layers), "moe/aux_loss" (summed over layers); under
  routing replay also "moe/replay_agreement" `[L]` (per layer, the fraction of replayed
  assignments the live routing also chose) and "moe/replay_agreement_mean" (over all layers).
  """
  if "load" not in aux:
    return {}
  vio = max_violation(aux["load"])
  dropped = jnp.sum(aux["dropped"]) / jnp.maximum(jnp.sum(aux["assignments"]), 1.0)
  out = {"moe/avg_maxvio": jnp.mean(vio), "moe/sup_maxvio": jnp.max(vio), "moe/maxvio": vio,
         "moe/load": aux["load"], "moe/dropped_frac": dropped,
         "moe/aux_loss": moe_aux_loss(aux)}
  if "replay_agree" in aux:
    n = aux["replayed"]
    out["moe/replay_agreement"] = jnp.where(n > 0, aux["replay_agree"] / jnp.maximum(n, 1.0), 1.0)
    out["moe/replay_agreement_mean"] = jnp.sum(aux["replay_agree"]) / jnp.maximum(jnp.sum(n), 1.0)
  return out


__all__ = ["Forced", "MoEState", "init_moe_params", "init_moe_state", "moe_aux_loss", "moe_block",
           "moe_metrics", "moe_param_axes", "moe_state_axes", "resolve_implementation",
           "routed_experts", "update_moe_state"]

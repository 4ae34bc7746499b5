"""The policy transformer: parameter init, logical axes, and the forward pass.

Parameters are a plain nested dict (a pytree); per-layer weights are stacked on a leading
`layers` axis and the forward pass scans over them (one compiled layer, fast compiles).

Layout (L layers, D hidden, Hq/Hkv heads of Dh, F mlp width, V vocab):
  embed [V, D]; final_norm [D]; unembed [D, V] (absent when tied)
  layers.attn_norm [L, D]; layers.mlp_norm [L, D]
  layers.attn.{wq [L, D, Hq, Dh], wk/wv [L, D, Hkv, Dh], wo [L, Hq, Dh, D],
               bq [L, Hq, Dh], bk/bv [L, Hkv, Dh] (attention_bias), q_norm/k_norm [L, Dh] (qk_norm)}
  layers.mlp.{w_gate/w_up [L, D, F], w_down [L, F, D]}   (dense)
  layers.moe.{...}                                       (MoE, see models/moe/block.py)
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_sys import backend
from jaxrl_sys.models import kv_cache as kvc
from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.models.layers import (masked_attention, merge_new_token, rms_norm,
                                     segment_causal_mask, single_query_attention, swiglu_mlp,
                                     token_matmul)
from jaxrl_sys.models.rope import apply_rope, rope_cos_sin
from jaxrl_sys.sharding.axes import (EMBED, HEAD_DIM, HEADS, KV_HEADS, LAYERS, MLP, NORM,
                                     VOCAB)

Params = dict[str, Any]


class ForwardOutput(NamedTuple):
  """hidden: final-normed hidden states `[batch, seq, hidden]` (compute dtype);
  cache: the updated KVCache or None; aux: dict of per-layer auxiliary outputs (MoE stats,
  stacked on a leading `[layers]` axis), empty for dense models; routes: the MoE routing of
  every token (`models.moe.replay.Routes`, `[batch, seq, layers, k]`) when `return_routes`,
  else None."""
  hidden: jax.Array
  cache: kvc.KVCache | None
  aux: dict
  routes: Any = None


def _normal(key, shape, dtype, std=0.02):
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: ModelConfig, key: jax.Array) -> Params:
  """Random initialisation (normal std 0.02, norms at 1), in `config.param_dtype`.

  Jitted (`config` static): one compiled program per configuration, where op-by-op
  execution would compile each random draw and cast of each distinct shape on its own."""
  c, dt = config, config.pdtype
  L, D, Hq, Hkv, Dh, F, V = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
                             c.head_dim, c.intermediate_size, c.vocab_size)
  ks = iter(jax.random.split(key, 16))
  attn = {"wq": _normal(next(ks), (L, D, Hq, Dh), dt), "wk": _normal(next(ks), (L, D, Hkv, Dh), dt),
          "wv": _normal(next(ks), (L, D, Hkv, Dh), dt), "wo": _normal(next(ks), (L, Hq, Dh, D), dt)}
  if c.attention_bias:
    attn.update(bq=_normal(next(ks), (L, Hq, Dh), dt), bk=_normal(next(ks), (L, Hkv, Dh), dt),
                bv=_normal(next(ks), (L, Hkv, Dh), dt))
  if c.qk_norm:
    attn.update(q_norm=jnp.ones((L, Dh), dt), k_norm=jnp.ones((L, Dh), dt))
  layers = {"attn_norm": jnp.ones((L, D), dt), "mlp_norm": jnp.ones((L, D), dt), "attn": attn}
  if c.moe is None:
    layers["mlp"] = {"w_gate": _normal(next(ks), (L, D, F), dt),
                     "w_up": _normal(next(ks), (L, D, F), dt),
                     "w_down": _normal(next(ks), (L, F, D), dt)}
  else:
    from jaxrl_sys.models.moe import block as moe  # pylint: disable=import-outside-toplevel
    layers["moe"] = moe.init_moe_params(c, next(ks))
  params = {"embed": _normal(next(ks), (V, D), dt), "final_norm": jnp.ones((D,), dt),
            "layers": layers}
  if not c.tie_embeddings:
    params["unembed"] = _normal(next(ks), (D, V), dt)
  return params


def param_axes(config: ModelConfig) -> Params:
  """Logical axis names for every parameter (same tree structure as `init_params`)."""
  c = config
  attn = {"wq": (LAYERS, EMBED, HEADS, HEAD_DIM),
          "wk": (LAYERS, EMBED, KV_HEADS, HEAD_DIM),
          "wv": (LAYERS, EMBED, KV_HEADS, HEAD_DIM),
          "wo": (LAYERS, HEADS, HEAD_DIM, EMBED)}
  if c.attention_bias:
    attn.update(bq=(LAYERS, HEADS, HEAD_DIM), bk=(LAYERS, KV_HEADS, HEAD_DIM),
                bv=(LAYERS, KV_HEADS, HEAD_DIM))
  if c.qk_norm:
    attn.update(q_norm=(LAYERS, NORM), k_norm=(LAYERS, NORM))
  layers = {"attn_norm": (LAYERS, NORM), "mlp_norm": (LAYERS, NORM), "attn": attn}
  if c.moe is None:
    layers["mlp"] = {"w_gate": (LAYERS, EMBED, MLP), "w_up": (LAYERS, EMBED, MLP),
                     "w_down": (LAYERS, MLP, EMBED)}
  else:
    from jaxrl_sys.models.moe import block as moe  # pylint: disable=import-outside-toplevel
    layers["moe"] = moe.moe_param_axes(c)
  axes = {"embed": (VOCAB, EMBED), "final_norm": (NORM,), "layers": layers}
  if not c.tie_embeddings:
    axes["unembed"] = (EMBED, VOCAB)
  return axes


def unembedding(params: Params, config: ModelConfig) -> jax.Array:
  """The output projection `[hidden, vocab]` (the transposed embedding when tied)."""
  return params["embed"].T if config.tie_embeddings else params["unembed"]


def logits_from_hidden(params: Params, config: ModelConfig, hidden) -> jax.Array:
  """`hidden [..., D]` -> float32 logits `[..., V]`."""
  w = unembedding(params, config).astype(hidden.dtype)
  return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)


def _qkv(p, x, cos, sin, config: ModelConfig):
  """Projected, normed and rotated q `[b, t, Hq, Dh]`, k/v `[b, t, Hkv, Dh]`."""
  c, dt = config, x.dtype
  q = token_matmul(x, p["wq"])
  k = token_matmul(x, p["wk"])
  v = token_matmul(x, p["wv"])
  if c.attention_bias:
    q, k, v = q + p["bq"].astype(dt), k + p["bk"].astype(dt), v + p["bv"].astype(dt)
  if c.qk_norm:
    q = rms_norm(q, p["q_norm"], c.rms_norm_eps)
    k = rms_norm(k, p["k_norm"], c.rms_norm_eps)
  return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _out_proj(p, out, dt):
  return token_matmul(out.astype(dt), p["wo"], contract=2)


def _self_attention(q, k, v, seg, scale, impl):
  which = backend.kernel_impl("flash_attention", impl, dtype=q.dtype, head_dim=q.shape[-1])
  if which != "xla":
    from jaxrl_sys import kernels  # pylint: disable=import-outside-toplevel
    return kernels.flash_attention(q, k, v, segment_ids=seg, causal=True, scale=scale,
                                   impl=which)
  return masked_attention(q, k, v, segment_causal_mask(seg, causal=True), scale)


def _decode_attention(q, k, v, kc, vc, kv_valid, lengths, new_valid, scale, impl):
  """One new token per row (`q [b, 1, Hq, Dh]`, `k/v [b, 1, Hkv, Dh]`) attends to the cache
  `kc/vc [b, S, Hkv, Dh]` where `kv_valid [b, S]` (read-only; valid slots lie below
  `lengths [b]`) and to itself where `new_valid`."""
  if impl not in backend.KERNELS["decode_attention"]:
    impl = "auto"          # "cudnn" names the training attention: decode picks its own
  # Valid slots lie below write_pos: the Pallas kernel skips blocks past it.
  if backend.uses_pallas("decode_attention", impl):
    from jaxrl_sys import kernels  # pylint: disable=import-outside-toplevel
    out, lse = kernels.decode_attention(q[:, 0], kc, vc, kv_valid, scale=scale, impl="pallas",
                                        lengths=jnp.minimum(lengths, kc.shape[1]),
                                        return_lse=True)
  else:
    out, lse = single_query_attention(q[:, 0], kc, vc, kv_valid, scale, return_lse=True)
  return merge_new_token(out, lse, q[:, 0], k[:, 0], v[:, 0], new_valid, scale)[:, None]


def forward(params: Params, config: ModelConfig, tokens, *, attention_mask=None, positions=None,
            segment_ids=None, cache: kvc.KVCache | None = None, moe_state: Any = None,
            kv_window: int | None = None, unroll_layers: bool = False, routes: Any = None,
            per_token_routing: bool | None = None, return_routes: bool = False) -> ForwardOutput:
  """Runs the decoder stack.

  Args:
    params: from `init_params` / HF import.
    config: the model config (static).
    tokens: `[batch, seq]` int32.
    attention_mask: `[batch, seq]` (1 = real token, 0 = padding; left or right). Default all 1.
    positions: `[batch, seq]` int32 RoPE positions. Default: cumsum of the mask - 1 (so left
      padding starts at 0), offset by `cache.next_position` when a cache is given.
    segment_ids: `[batch, seq]` int32 for packed sequences (0 = padding; no cache). Default:
      the attention mask.
    cache: a `KVCache` to append to (prefill or decode); None for a full (training) forward.
      For one-token decode the cache may hold more rows than `tokens`: rows `[0, batch)` are
      used and the others left untouched (the rollout engine decodes a bucket of its slots).
    moe_state: per-layer balancing state for MoE layers (stacked on `[layers]`), or None.
    kv_window: static; when decoding one token per row, attend only to cache slots
      `[0, kv_window)` (the caller guarantees every valid slot lies there). Saves reading the
      unused tail of a long cache; None reads all `cache.max_len` slots.
    unroll_layers: static; without a cache, unroll the scan over layers. XLA:CPU then runs no
      while loop and stacks no per-layer residuals for the backward pass (about 15% faster
      training steps for shallow models), at the cost of compiling every layer separately.
    routes: MoE only: recorded routes to replay (`models.moe.replay.Routes`, experts
      `[batch, seq, layers, k]`): the positions of `routes.mask` use the recorded experts, with
      gates from the live router scores (router gradients flow); None routes live.
    per_token_routing: MoE only: route every token on its own with the stored balancing state
      (no BIP sweeps, no capacity drop), so a token's experts do not depend on its batch-mates;
      False routes the batch as a whole (BIP sweeps and capacity over the batch, as training
      does). Default: per token with a cache (inference), by batch without (training).
    return_routes: MoE only: also return the routing of every position (`ForwardOutput.routes`).

  Returns:
    ForwardOutput(hidden `[batch, seq, hidden]`, new cache or None, aux dict, routes or None).
  """
  c = config
  b, t = tokens.shape
  mask = jnp.ones((b, t), jnp.int32) if attention_mask is None else attention_mask.astype(jnp.int32)
  if positions is None:
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    if cache is not None:
      positions = positions + cache.next_position[:b, None]
  seg = mask if segment_ids is None else segment_ids
  x = params["embed"][tokens].astype(c.cdtype)
  cos, sin = rope_cos_sin(positions, c.rope, c.head_dim, c.cdtype)
  scale = c.head_dim ** -0.5
  per_token = cache is not None if per_token_routing is None else bool(per_token_routing)
  if c.moe is None and (routes is not None or return_routes):
    raise ValueError("routes / return_routes need an MoE model (config.moe is None)")
  route_xs, forced_mask = None, None
  if routes is not None:
    from jaxrl_sys.models.moe import replay  # pylint: disable=import-outside-toplevel
    ex, forced_mask, act = replay.as_layer_major(routes, b, t, c.num_layers,
                                                 c.moe.num_experts_per_tok)
    route_xs = (ex, act)

  def ffn(p, x, lstate, rxs):
    h = rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
    if c.moe is None:
      return x + swiglu_mlp(p["mlp"], h), {}
    from jaxrl_sys.models.moe import block as moe  # pylint: disable=import-outside-toplevel
    forced = None if rxs is None else moe.Forced(rxs[0], forced_mask, rxs[1])
    out, aux = moe.moe_block(p["moe"], h, c, lstate, token_mask=mask, forced=forced,
                             per_token=per_token, return_experts=return_routes)
    return x + out, aux

  def finish(hidden, new_cache, aux):
    out_routes = None
    if return_routes:
      from jaxrl_sys.models.moe import replay  # pylint: disable=import-outside-toplevel
      aux = dict(aux)
      out_routes = replay.from_layer_major(aux.pop("experts"), aux.pop("active"), mask,
                                           c.moe.num_experts)
    return ForwardOutput(hidden, new_cache, aux, out_routes)

  if cache is None:
    def layer(x, xs):
      p, lstate, rxs = xs
      q, k, v = _qkv(p["attn"], rms_norm(x, p["attn_norm"], c.rms_norm_eps), cos, sin, c)
      x = x + _out_proj(p["attn"], _self_attention(q, k, v, seg, scale, c.attention_impl), x.dtype)
      return ffn(p, x, lstate, rxs)

    x, aux = jax.lax.scan(layer, x, (params["layers"], moe_state, route_xs),
                          unroll=True if unroll_layers else 1)
    return finish(rms_norm(x, params["final_norm"], c.rms_norm_eps), None, aux)

  if cache.batch != b and t != 1:
    raise ValueError(f"cache holds {cache.batch} rows but tokens have {b}: only one-token "
                     "decode may use the first rows of a larger cache")
  view = cache if cache.batch == b else kvc.KVCache(
      cache.k, cache.v, cache.kv_valid[:b], cache.write_pos[:b], cache.next_position[:b])
  kv_after, write_after, next_after = kvc.advance(view, mask)
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
  slots = view.write_pos[:, None] + jnp.arange(t)[None, :]

  if t == 1:
    # Decode: every layer reads its cache slice (scan xs, never rewritten) and folds in the new
    # token's own k/v; the new k/v of all layers are scattered into the stacked cache once after
    # the scan (in place when the cache is a loop carry or a donated argument). Rows whose
    # token is padding write nothing.
    w = cache.max_len if kv_window is None else min(kv_window, cache.max_len)
    live = mask[:, 0] > 0

    def decode_layer(x, xs):
      p, lstate, rxs, kc, vc = xs
      q, k, v = _qkv(p["attn"], rms_norm(x, p["attn_norm"], c.rms_norm_eps), cos, sin, c)
      out = _decode_attention(q, k, v, kc[:b, :w], vc[:b, :w], view.kv_valid[:, :w],
                              view.write_pos, live, scale, c.attention_impl)
      x, aux = ffn(p, x + _out_proj(p["attn"], out, x.dtype), lstate, rxs)
      return x, (k[:, 0], v[:, 0], aux)

    x, (k_new, v_new, aux) = jax.lax.scan(
        decode_layer, x, (params["layers"], moe_state, route_xs, cache.k, cache.v))
    dst = jnp.where(live, slots[:, 0], cache.max_len)      # out of range: dropped
    k_all = cache.k.at[:, rows[:, 0], dst].set(k_new.astype(cache.k.dtype), mode="drop")
    v_all = cache.v.at[:, rows[:, 0], dst].set(v_new.astype(cache.v.dtype), mode="drop")
    if cache.batch != b:
      kv_after = cache.kv_valid.at[:b].set(kv_after)
      write_after = cache.write_pos.at[:b].set(write_after)
      next_after = cache.next_position.at[:b].set(next_after)
  else:
    # Prefill / chunk: each layer's cache slice goes through the scan and the chunk is written
    # at per-row slots `write_pos + arange(t)` before attending.
    attn_mask = kvc.chunk_mask(cache, kv_after, t)

    def chunk_layer(x, xs):
      p, lstate, rxs, kc, vc = xs
      q, k, v = _qkv(p["attn"], rms_norm(x, p["attn_norm"], c.rms_norm_eps), cos, sin, c)
      kc = kc.at[rows, slots].set(k.astype(kc.dtype), mode="drop")
      vc = vc.at[rows, slots].set(v.astype(vc.dtype), mode="drop")
      out = masked_attention(q, kc.astype(x.dtype), vc.astype(x.dtype), attn_mask, scale)
      x, aux = ffn(p, x + _out_proj(p["attn"], out, x.dtype), lstate, rxs)
      return x, (kc, vc, aux)

    x, (k_all, v_all, aux) = jax.lax.scan(
        chunk_layer, x, (params["layers"], moe_state, route_xs, cache.k, cache.v))
  hidden = rms_norm(x, params["final_norm"], c.rms_norm_eps)
  return finish(hidden, kvc.KVCache(k_all, v_all, kv_after, write_after, next_after), aux)


def last_valid_index(mask) -> jax.Array:
  """Index of the last real token per row of `mask [batch, seq]` -> `[batch]` int32."""
  t = mask.shape[1]
  last = jnp.max(jnp.where(mask > 0, jnp.arange(1, t + 1)[None, :], 0), axis=1) - 1
  return last.astype(jnp.int32)


def num_params(params: Params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))

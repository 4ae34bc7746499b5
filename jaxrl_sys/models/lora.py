"""Low-rank adapters (LoRA) beside a frozen base: targets, initialisation, logical axes,
merging, sizes and the base's digest (the adapted matmul is `layers.adapted_matmul`, the
per-layer plumbing of the forward `models.adapters`; both re-exported here).

The adapters are a pytree of their own, never inside the parameters. For each targeted weight
W of `params["layers"]` (stacked over layers, see `models/transformer.py`) the adapter tree
holds `{"a": A, "b": B}` at the same path (L layers, E experts, r the rank):

  attn.wq        a [L, D, r]       b [L, r, Hq, Dh]     (wk, wv: Hkv heads)
  attn.wo        a [L, Hq, Dh, r]  b [L, r, D]
  mlp.w_gate     a [L, D, r]       b [L, r, F]          (w_up alike; w_down a [L, F, r])
  moe.w_gate     a [L, E, D, r]    b [L, E, r, F]       (routed experts: one pair per expert)
  moe.shared.*   as mlp.* with the shared expert's width

A targeted projection computes `x @ W + s * (x @ A) @ B` with `s = alpha / rank`: the frozen
matmul as it is, plus two skinny matmuls (no merged weight, so nothing of the update is lost
to the base's dtype). B starts at zero, so the adapted model starts as the base, bit for bit.
`merge_lora` folds the update into the base weights instead (float32 sum, one cast): the
rollout engines' optional fast path, which in bfloat16 rounds small updates away.

Adapters are float32 (the precision policy's masters); the base keeps its checkpoint dtype
and never changes. `base_digest` names a base by its contents, so adapters are never applied
to, or resumed on, another base.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models.adapters import (NO_EXPERT_ADAPTERS, WEIGHTS, get_path, layer_adapters,
                                       routed, shared)
from jaxrl_sys.models.config import LoraConfig, ModelConfig
from jaxrl_sys.models.layers import Adapter, adapted_matmul
from jaxrl_sys.models.transformer import init_params, param_axes

Adapters = dict[str, Any]
_GROUPS = {"attention": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down")}


def _lora(config: ModelConfig) -> LoraConfig:
  if config.lora is None:
    raise ValueError("ModelConfig.lora is None: this model has no adapters (set --lora.rank)")
  return config.lora


def target_paths(config: ModelConfig) -> tuple[tuple[str, ...], ...]:
  """The weight paths (under `params["layers"]`) that `config.lora.targets` adapt, in a fixed
  order.

  Raises:
    ValueError: a target the model does not have (experts / shared on a dense model, shared
      without shared experts), or routed-expert adapters with an MoE implementation that has
      none (`NO_EXPERT_ADAPTERS`).
  """
  lc = _lora(config)
  names: set[str] = set()
  for t in lc.target_names:
    names.update(_GROUPS.get(t, (t,)))
  moe = config.moe
  if moe is None and names & {"experts", "shared"}:
    raise ValueError(f"--lora.targets={lc.targets!r}: experts / shared name MoE projections, "
                     "and this model is dense; use attention, mlp or q,k,v,o,gate,up,down")
  if moe is not None and "shared" in names and not moe.shared_width:
    raise ValueError(f"--lora.targets={lc.targets!r}: this MoE model has no shared expert")
  out = []
  for path, (name, _, lead) in WEIGHTS.items():
    if path[0] == "attn":
      hit = name in names
    elif path[0] == "mlp":
      hit = moe is None and name in names
    elif lead == 2:
      hit = moe is not None and (name in names or "experts" in names)
    else:
      hit = moe is not None and bool(moe.shared_width) and (name in names or "shared" in names)
    if hit:
      out.append(path)
  if moe is not None and any(len(p) == 2 and p[0] == "moe" for p in out) and (
      moe.implementation in NO_EXPERT_ADAPTERS):
    raise ValueError(f"MoEConfig.implementation={moe.implementation!r} has no routed-expert "
                     f"adapters; use auto, blocked, ragged, dense or expert_parallel, or leave "
                     "the experts out of --lora.targets")
  return tuple(out)


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _shapes(config: ModelConfig) -> dict[tuple[str, ...], tuple[tuple[int, ...], tuple[int, ...]]]:
  """Targeted path -> (A's shape, B's shape), stacked over layers (and experts)."""
  base = jax.eval_shape(lambda: init_params(without_lora(config), jax.random.key(0)))
  r = _lora(config).rank
  out = {}
  for path in target_paths(config):
    _, contract, lead = WEIGHTS[path]
    shape = get_path(base["layers"], path).shape
    stack, rest = shape[:lead], shape[lead:]
    out[path] = (stack + rest[:contract] + (r,), stack + (r,) + rest[contract:])
  return out


def without_lora(config: ModelConfig) -> ModelConfig:
  """`config` without adapters: the base model."""
  return dataclasses.replace(config, lora=None) if config.lora is not None else config


@functools.partial(jax.jit, static_argnums=0)
def init_lora(config: ModelConfig, key: jax.Array) -> Adapters:
  """Fresh adapters for `config.lora`: A uniform in +-1/sqrt(fan_in) (PEFT's default,
  Kaiming-uniform with a = sqrt(5)), B zero; float32 (`config.param_dtype` when it is
  bfloat16 on purpose). Jitted (`config` static).

  Returns:
    `{"layers": {...path: {"a": A, "b": B}}}` (layout in the module docstring).
  """
  out: dict = {}
  shapes = _shapes(config)
  keys = jax.random.split(key, max(len(shapes), 1))
  for k, (path, (sa, sb)) in zip(keys, shapes.items()):
    _, contract, lead = WEIGHTS[path]
    fan_in = math.prod(sa[lead:lead + contract])
    bound = 1.0 / math.sqrt(fan_in)
    a = jax.random.uniform(k, sa, jnp.float32, -bound, bound).astype(config.pdtype)
    _set(out, path, {"a": a, "b": jnp.zeros(sb, config.pdtype)})
  return {"layers": out}


def lora_axes(config: ModelConfig) -> Adapters:
  """Logical axes of `init_lora`'s tree: A takes W's input axes, B its output axes, the rank
  axis is replicated (same tree structure)."""
  axes = param_axes(without_lora(config))["layers"]
  out: dict = {}
  for path in target_paths(config):
    _, contract, lead = WEIGHTS[path]
    w = get_path(axes, path)
    stack, rest = tuple(w[:lead]), tuple(w[lead:])
    _set(out, path, {"a": stack + rest[:contract] + (None,),
                     "b": stack + (None,) + rest[contract:]})
  return {"layers": out}


def check_lora(config: ModelConfig, lora: Any) -> None:
  """Raises ValueError unless `lora` has exactly `init_lora(config)`'s tree and shapes."""
  want = jax.eval_shape(lambda: init_lora(config, jax.random.key(0)))
  got_leaves = {jax.tree_util.keystr(p): tuple(np.shape(x))
                for p, x in jax.tree_util.tree_flatten_with_path(lora)[0]}
  want_leaves = {jax.tree_util.keystr(p): tuple(x.shape)
                 for p, x in jax.tree_util.tree_flatten_with_path(want)[0]}
  if got_leaves != want_leaves:
    missing = sorted(set(want_leaves) - set(got_leaves))
    extra = sorted(set(got_leaves) - set(want_leaves))
    shapes = [f"{k} {got_leaves[k]} (want {want_leaves[k]})" for k in sorted(want_leaves)
              if k in got_leaves and got_leaves[k] != want_leaves[k]]
    raise ValueError(f"the adapters do not fit --lora.rank={config.lora.rank} "
                     f"--lora.targets={config.lora.targets!r}: missing {missing[:6]}, extra "
                     f"{extra[:6]}, wrong shape {shapes[:6]}")


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def merge_lora(params: Any, lora: Adapters, *, config: ModelConfig, dtype: str | None = None):
  """The base with every adapted weight replaced by `W + scale * A @ B`: the sum in float32,
  then one cast to `dtype` (default: each weight's own). Other leaves are cast to `dtype` too.

  In bfloat16, an entry of `scale * A @ B` below half a unit in the last place of W's entry
  (|dW| < |W| * 2^-9) is rounded away; docs/lora.md measures how much of an early update that
  is. Jitted (`config`, `dtype` static)."""
  scale = _lora(config).scale
  out = jax.tree.map(lambda x: x, params)
  for path in target_paths(config):
    _, contract, lead = WEIGHTS[path]
    ab = get_path(lora["layers"], path)
    w = get_path(params["layers"], path)
    stack = w.shape[:lead]
    a = ab["a"].astype(jnp.float32).reshape(*stack, -1, ab["a"].shape[-1])
    b = ab["b"].astype(jnp.float32).reshape(*stack, ab["b"].shape[lead], -1)
    dw = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST).reshape(w.shape)
    _set(out["layers"], path, (w.astype(jnp.float32) + scale * dw).astype(w.dtype))
  if dtype is not None:
    out = jax.tree.map(lambda x: x.astype(dtype), out)
  return out


def nbytes(tree: Any) -> int:
  """Total bytes of the arrays of `tree` (adapters, parameters: what a publish moves)."""
  return int(sum(np.dtype(x.dtype).itemsize * math.prod(x.shape) for x in jax.tree.leaves(tree)))


def base_digest(params: Any) -> str:
  """A short content name of a base (16 hex digits): sha256 over every leaf's path, shape,
  dtype and `utils.fingerprint` (computed on device, the same on any mesh). Compute it on the
  base as it is held (its checkpoint dtype): a cast base is another base."""
  from jaxrl_sys.utils.fingerprint import fingerprint  # pylint: disable=import-outside-toplevel
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  prints = fingerprint([x for _, x in leaves])
  rows = [[jax.tree_util.keystr(p), list(x.shape), str(x.dtype), f]
          for (p, x), f in zip(leaves, prints)]
  return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


__all__ = ["Adapter", "Adapters", "NO_EXPERT_ADAPTERS", "WEIGHTS", "adapted_matmul",
           "base_digest", "check_lora", "get_path", "init_lora", "layer_adapters", "lora_axes",
           "merge_lora", "nbytes", "routed", "shared", "target_paths", "without_lora"]

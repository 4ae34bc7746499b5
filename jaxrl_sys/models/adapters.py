"""LoRA adapters inside the forward pass: which weights may carry one (`WEIGHTS`), and the
`layers.Adapter`s of one layer from its slice of the adapter tree (`layer_adapters`, what the
layer scans of `models.transformer.forward` and the MoE block apply). The adapter tree itself
(initialisation, targets, axes, merging) is `models.lora`."""
from __future__ import annotations

from typing import Any

import jax

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.models.layers import Adapter

# Every weight an adapter may target: path under params["layers"] -> (target name, contracted
# axes of its matmul, leading stacked axes: 1 = layers, 2 = layers and experts).
WEIGHTS: dict[tuple[str, ...], tuple[str, int, int]] = {
    ("attn", "wq"): ("q", 1, 1), ("attn", "wk"): ("k", 1, 1), ("attn", "wv"): ("v", 1, 1),
    ("attn", "wo"): ("o", 2, 1),
    ("mlp", "w_gate"): ("gate", 1, 1), ("mlp", "w_up"): ("up", 1, 1),
    ("mlp", "w_down"): ("down", 1, 1),
    ("moe", "w_gate"): ("gate", 1, 2), ("moe", "w_up"): ("up", 1, 2),
    ("moe", "w_down"): ("down", 1, 2),
    ("moe", "shared", "w_gate"): ("gate", 1, 1), ("moe", "shared", "w_up"): ("up", 1, 1),
    ("moe", "shared", "w_down"): ("down", 1, 1),
}
_PATHS = tuple(WEIGHTS)
_ROUTED = ("w_gate", "w_up", "w_down")
# MoE paths whose custom-VJP kernels have no adapter terms ("auto" picks "blocked" instead).
NO_EXPERT_ADAPTERS = ("slots", "segments")


def get_path(tree: Any, path: tuple[str, ...]) -> Any:
  """`tree[path[0]][path[1]]...`, or None where a key is missing."""
  for k in path:
    if tree is None or k not in tree:
      return None
    tree = tree[k]
  return tree


def layer_adapters(layer_lora: Any, config: ModelConfig,
                   key: jax.Array | None = None) -> dict[tuple[str, ...], Adapter]:
  """`{path: Adapter}` of one layer from its slice of the adapter tree (`lora["layers"]`
  without the layers axis); `key` (this layer's dropout key, or None) gives each weight its
  own dropout key. Empty for `layer_lora=None`."""
  if layer_lora is None:
    return {}
  lc = config.lora
  out = {}
  for i, path in enumerate(_PATHS):
    ab = get_path(layer_lora, path)
    if ab is None:
      continue
    k = None if key is None or not lc.dropout else jax.random.fold_in(key, i)
    out[path] = Adapter(ab["a"], ab["b"], lc.scale, k, lc.dropout)
  return out


def routed(adapters: dict[tuple[str, ...], Adapter]) -> dict[str, Adapter]:
  """The routed experts' adapters of one layer, by weight name (`w_gate`, `w_up`, `w_down`)."""
  return {name: adapters[("moe", name)] for name in _ROUTED if ("moe", name) in adapters}


def shared(adapters: dict[tuple[str, ...], Adapter]) -> dict[str, Adapter]:
  """The shared expert's adapters of one layer, by weight name."""
  return {p[-1]: a for p, a in adapters.items() if p[:2] == ("moe", "shared")}



__all__ = ["NO_EXPERT_ADAPTERS", "WEIGHTS", "get_path", "layer_adapters", "routed", "shared"]

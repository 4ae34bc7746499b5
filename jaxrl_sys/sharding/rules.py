"""Logical axis names -> mesh PartitionSpecs, through one rules table.

Parameters and batches are annotated with logical axis names (the constants of
`sharding/axes.py`). A rules table maps each logical name to a mesh axis (or None = replicated).
FSDP shards the "embed" dimension of weights over "data"; tensor/expert parallelism uses "model".
A dimension whose size does not divide the mesh axis size is replicated instead, so tiny models
run on any mesh.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_sys.sharding.axes import (BATCH, EMBED, EXPERT, EXPERT_MLP, HEAD_DIM, HEADS, KV_HEADS,
                                     LAYERS, MLP, NORM, VOCAB)

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

DEFAULT_RULES: Rules = (
    # batches
    (BATCH, "data"),
    # parameters
    (EMBED, "data"),         # FSDP
    (VOCAB, "model"),
    (HEADS, "model"),
    (KV_HEADS, "model"),
    (HEAD_DIM, None),
    (MLP, "model"),
    (EXPERT, "model"),       # expert parallelism
    (EXPERT_MLP, None),
    (LAYERS, None),
    (NORM, None),
)


def _lookup(rules: Rules, name: str | None):
  if name is None:
    return None
  for k, v in rules:
    if k == name:
      return v
  raise KeyError(f"logical axis {name!r} has no rule; known: {[k for k, _ in rules]}")


def logical_to_spec(logical_axes: Sequence[str | None], mesh: jax.sharding.Mesh,
                    shape: Sequence[int] | None = None, rules: Rules = DEFAULT_RULES) -> P:
  """PartitionSpec for one array with the given logical axes.

  A mesh axis is used at most once per array (first dimension wins), axes missing from the
  mesh or of size 1 are dropped, and when `shape` is given a dimension that does not divide
  the mesh axis size stays replicated.
  """
  used: set[str] = set()
  out = []
  for i, name in enumerate(logical_axes):
    target = _lookup(rules, name)
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    keep = []
    for a in axes:
      if a in used or a not in mesh.shape or mesh.shape[a] == 1:
        continue
      keep.append(a)
    if keep and shape is not None:
      size = 1
      for a in keep:
        size *= mesh.shape[a]
      if shape[i] % size:
        keep = []
    used.update(keep)
    out.append(None if not keep else (keep[0] if len(keep) == 1 else tuple(keep)))
  return P(*out)


def tree_shardings(tree: Any, logical_axes: Any, mesh: jax.sharding.Mesh,
                   rules: Rules = DEFAULT_RULES) -> Any:
  """NamedShardings for every leaf of `tree` (arrays or ShapeDtypeStructs).

  `logical_axes` has the same structure as `tree`, with a tuple of names per leaf.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  axes_leaves = treedef.flatten_up_to(logical_axes)
  specs = []
  for leaf, axes in zip(leaves, axes_leaves):
    if len(axes) != len(leaf.shape):
      raise ValueError(f"logical axes {axes} do not match the array shape {leaf.shape}")
    specs.append(NamedSharding(mesh, logical_to_spec(axes, mesh, leaf.shape, rules)))
  return jax.tree_util.tree_unflatten(treedef, specs)


def shard_tree(tree: Any, logical_axes: Any, mesh: jax.sharding.Mesh,
               rules: Rules = DEFAULT_RULES) -> Any:
  """Places every leaf of `tree` on `mesh` according to its logical axes."""
  return jax.device_put(tree, tree_shardings(tree, logical_axes, mesh, rules))


def with_rules(overrides: Mapping[str, Any], rules: Rules = DEFAULT_RULES) -> Rules:
  """A copy of `rules` with some logical names remapped."""
  unknown = sorted(set(overrides) - {k for k, _ in rules})
  if unknown:
    raise ValueError(f"unknown logical axis name(s) {unknown}")
  return tuple((k, overrides.get(k, v)) for k, v in rules)

"""Meshes and sharding rules.

- `parse_mesh("8x4") -> MeshSpec`, `make_mesh(spec)`: named device meshes ("data", "model").
- `logical_to_spec`, `tree_shardings`, `shard_tree`: logical axis names (the constants of
  `sharding.axes`) -> PartitionSpecs via one rules table (`DEFAULT_RULES`).
"""
from jaxrl_sys.sharding import axes
from jaxrl_sys.sharding.mesh import (DEFAULT_AXIS_NAMES, MeshSpec, describe_devices, make_mesh,
                                     parse_mesh, single_device_mesh)
from jaxrl_sys.sharding.rules import (DEFAULT_RULES, Rules, logical_to_spec, shard_tree,
                                      tree_shardings, with_rules)

__all__ = [
    "DEFAULT_AXIS_NAMES", "DEFAULT_RULES", "axes", "MeshSpec", "Rules", "describe_devices",
    "logical_to_spec", "make_mesh", "parse_mesh", "shard_tree", "single_device_mesh",
    "tree_shardings", "with_rules",
]

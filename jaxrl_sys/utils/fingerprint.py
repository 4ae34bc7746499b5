"""A sharding-independent fingerprint of a pytree of arrays (integrity checks).

`fingerprint(tree)` is one uint32 per leaf: a position-weighted sum of the leaf's bits, computed
on device (so it never gathers a sharded array to the host) and identical on any mesh.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _leaf_fingerprint(x):
  nbytes = x.dtype.itemsize
  if x.dtype == jnp.bool_:
    bits = x.astype(jnp.uint32)
  elif nbytes == 4:
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
  elif nbytes == 2:
    bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  elif nbytes == 1:
    bits = jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
  else:
    raise TypeError(f"fingerprint: unsupported dtype {x.dtype}")
  bits = bits.reshape(-1)
  weights = jnp.arange(bits.shape[0], dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
  return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _fingerprints(leaves):
  if not leaves:
    return jnp.zeros((0,), jnp.uint32)
  return jnp.stack([_leaf_fingerprint(x) for x in leaves])


def fingerprint(tree: Any) -> list[int]:
  """A position-weighted uint32 sum of the bits of every leaf (independent of sharding)."""
  leaves = [x for x in jax.tree.leaves(tree)]
  return [int(v) for v in np.asarray(_fingerprints(leaves))]

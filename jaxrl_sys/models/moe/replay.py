"""Routing replay: recorded expert choices as data (`Routes`), imposed on a forward.

A forward of an MoE policy chooses k experts per token and layer. `forward(..., return_routes=
True)` returns that choice as `Routes`; `forward(..., routes=r)` imposes a recorded choice
instead. Forced experts keep the order they were chosen in; their gate weights are gathered
from the *live* router scores, so the router keeps its gradient. Loads, the auxiliary loss and
the aux-free bias update count the replayed assignment; BIP's duals are still solved on the
live scores (they price the experts for the per-token routing of the next rollout, a function
of the scores alone).

Layout: token-major everywhere (engine records, requests, train batches, `forward`), so the
routes of a sequence are a `[tokens, layers, k]` array that grows like its tokens. Expert ids
are stored compactly (`route_dtype`: uint8 up to 256 experts, uint16 above).

Why it matters: BIP balancing and capacity limits route a token according to its batch-mates,
so the trainer's batch (and even a decode batch) would route a token differently from the
rollout that sampled it. Inference routes every token on its own (`per_token` routing: the
stored balancing state, no capacity drop), and training replays those routes (R3), so the
trainer's log-probs are those of the experts that produced the samples.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models.moe.routing import route_dtype


class Routes(NamedTuple):
  """Routing decisions of a batch of sequences, token-major.

  experts: `[batch, seq, layers, k]` integer expert ids (uint8 up to 256 experts, see
    `route_dtype`), in the order top-k chose them.
  mask: `[batch, seq]` bool, the positions whose routes are recorded (forced on replay; the
    others route live); None = every position.
  active: `[batch, seq, layers, k]` bool, assignments that were computed (False: dropped by a
    capacity limit); None = every assignment of a real token.
  """
  experts: jax.Array
  mask: jax.Array | None = None
  active: jax.Array | None = None


def as_layer_major(routes: Routes, batch: int, seq: int, num_layers: int, k: int):
  """(experts `[L, b, t, k]`, mask `[b, t]` bool, active `[L, b, t, k]` or None) for the scan
  over layers; raises ValueError naming the shapes when they do not fit the forward."""
  want = (batch, seq, num_layers, k)
  if tuple(routes.experts.shape) != want:
    raise ValueError(f"routes.experts has shape {tuple(routes.experts.shape)}; this forward "
                     f"needs [batch, seq, layers, k] = {list(want)}")
  if routes.active is not None and tuple(routes.active.shape) != want:
    raise ValueError(f"routes.active has shape {tuple(routes.active.shape)}; expected "
                     f"{list(want)}")
  if routes.mask is not None and tuple(routes.mask.shape) != (batch, seq):
    raise ValueError(f"routes.mask has shape {tuple(routes.mask.shape)}; expected "
                     f"[batch, seq] = {[batch, seq]}")
  experts = jnp.moveaxis(jnp.asarray(routes.experts), 2, 0)
  active = None if routes.active is None else jnp.moveaxis(jnp.asarray(routes.active), 2, 0)
  mask = (jnp.ones((batch, seq), bool) if routes.mask is None
          else jnp.asarray(routes.mask).astype(bool))
  return experts, mask, active


def from_layer_major(experts: jax.Array, active: jax.Array, mask: jax.Array,
                     num_experts: int) -> Routes:
  """`Routes` from the scan's stacked `[L, b, t, k]` experts / active and the token mask."""
  return Routes(jnp.moveaxis(experts, 0, 2).astype(route_dtype(num_experts)),
                mask.astype(bool), jnp.moveaxis(active, 0, 2))


def route_bytes(routes) -> int:
  """Bytes of a host route record (an array, a `Routes`, or None = 0)."""
  if routes is None:
    return 0
  if isinstance(routes, Routes):
    return sum(int(np.asarray(a).nbytes) for a in routes if a is not None)
  return int(np.asarray(routes).nbytes)


__all__ = ["Routes", "as_layer_major", "from_layer_major", "route_bytes", "route_dtype"]

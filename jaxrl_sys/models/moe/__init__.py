"""Mixture-of-Experts: the block, its routing and its expert paths.

- `block`: the MoE feed-forward block (`moe_block`), its parameters, balancing state (`MoEState`)
  and metrics.
- `routing`: router scores, biased top-k, BIP dual sweeps, capacity, losses (pure functions).
- `experts`: the dense einsum reference and the dropless grouped matmul (ragged_dot).
- `slots`, `segments`, `blocked`: the exact dropless expert paths for XLA:CPU.
- `replay`: recorded routes as data (`Routes`) for routing replay (R3).
"""
from jaxrl_sys.models.moe.block import (Forced, MoEState, init_moe_params, init_moe_state,
                                        moe_aux_loss, moe_block, moe_metrics, moe_param_axes,
                                        moe_state_axes, resolve_implementation, routed_experts,
                                        update_moe_state)
from jaxrl_sys.models.moe.replay import Routes, route_bytes, route_dtype

__all__ = [
    "Forced", "MoEState", "Routes", "init_moe_params", "init_moe_state", "moe_aux_loss",
    "moe_block", "moe_metrics", "moe_param_axes", "moe_state_axes", "resolve_implementation",
    "routed_experts", "route_bytes", "route_dtype", "update_moe_state",
]

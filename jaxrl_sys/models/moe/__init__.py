"""Mixture-of-Experts: the block, its routing and its expert paths.

- `block`: the MoE feed-forward block (`moe_block`), its parameters, balancing state (`MoEState`)
  and metrics.
- `routing`: router scores, biased top-k, BIP dual sweeps, capacity, losses (pure functions).
- `experts`: the dense einsum reference and the dropless grouped matmul (ragged_dot).
- `slots`, `segments`, `blocked`: the exact dropless expert paths for XLA:CPU.
"""
from jaxrl_sys.models.moe.block import (MoEState, init_moe_params, init_moe_state, moe_aux_loss,
                                        moe_block, moe_metrics, moe_param_axes, moe_state_axes,
                                        resolve_implementation, routed_experts, update_moe_state)

__all__ = [
    "MoEState", "init_moe_params", "init_moe_state", "moe_aux_loss", "moe_block", "moe_metrics",
    "moe_param_axes", "moe_state_axes", "resolve_implementation", "routed_experts",
    "update_moe_state",
]

"""Pallas kernels, each beside its plain-XLA reference, behind one function with `impl=`.

- `fused_logprobs(hidden [tokens, d], unembed [d, vocab], targets [tokens]) -> (logprobs,
  entropy)`: streams over vocabulary chunks, never materialises `[tokens, vocab]` logits.
- `flash_attention(q, k, v, *, segment_ids, causal)`: segment/causal masked GQA attention.
- `decode_attention(q, k_cache, v_cache, kv_mask)`: one new token per sequence over a KV cache.
- `grouped_matmul(lhs, rhs, group_sizes)`: ragged per-group matmul for MoE experts.

`impl="auto"` picks per backend in one table (`jaxrl_sys.backend.AUTO`): on GPU the token-chunked
log-probs, cuDNN attention, the Pallas decode attention and Pallas grouped matmul; XLA paths on
CPU and TPU. `impl="pallas"` on CPU runs the kernels in interpret mode (see `dispatch`).
"""
from jaxrl_sys.kernels.decode_attention import decode_attention, decode_attention_reference
from jaxrl_sys.kernels.dispatch import default_interpret
from jaxrl_sys.kernels.flash_attention import (attention_dpa, attention_mask,
                                               attention_reference, flash_attention)
from jaxrl_sys.kernels.grouped_matmul import grouped_matmul, grouped_matmul_reference
from jaxrl_sys.kernels.logprobs import fused_logprobs, logprobs_reference

__all__ = [
    "attention_dpa", "attention_mask", "attention_reference", "decode_attention",
    "decode_attention_reference", "default_interpret", "flash_attention", "fused_logprobs",
    "grouped_matmul", "grouped_matmul_reference", "logprobs_reference",
]

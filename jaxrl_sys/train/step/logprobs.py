"""The policy forward of the train step: per-token log-probs and entropy of a packed batch's
targets on its scoring window (`token_logprobs`), the window gather with a gather backward
(`score_window`), and the MoE routes a forward replays (`batch_routes`).

Log-probs and entropy come from `kernels.fused_logprobs(hidden, unembed, targets, temperature)`
at the temperature the responses were sampled at (`models.SamplingConfig`). With LoRA the
forward runs the frozen base with the adapters beside its matmuls (`lora=`), dropout drawn from
`lora_rng`. MoE routes: "R3" replays the rollout's (`batch.routes` where `batch.route_mask`);
the router is never adapted, so the replayed routes stay meaningful under LoRA.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_sys import kernels
from jaxrl_sys.models import ModelConfig, SamplingConfig, forward, unembedding
from jaxrl_sys.train.step.batch import TrainBatch
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.step.state import TrainState

# The sampling config of a step given none: temperature 1.
SAMPLING = SamplingConfig()


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def score_window(hidden, start, width: int):
  """`hidden [rows, T, d]` at positions `start[:, None] + arange(width)` -> `[rows, width, d]`.

  The caller guarantees `start + width <= T` (`batch.pack` checks it). The backward is a gather
  too (position t of row r takes window entry `t - start[r]`, or 0 outside the window), not
  the scatter-add autodiff would emit.
  """
  pos = start[:, None] + jnp.arange(width, dtype=start.dtype)[None, :]
  return jnp.take_along_axis(hidden, pos[..., None], axis=1)


def _score_window_fwd(hidden, start, width):
  return score_window(hidden, start, width), (start, hidden.shape[1])


def _score_window_bwd(width, res, g):
  start, t = res
  j = jnp.arange(t, dtype=start.dtype)[None, :] - start[:, None]             # [rows, T]
  inside = (j >= 0) & (j < width)
  dh = jnp.take_along_axis(g, jnp.clip(j, 0, width - 1)[..., None], axis=1)
  return jnp.where(inside[..., None], dh, 0).astype(g.dtype), None


score_window.defvjp(_score_window_fwd, _score_window_bwd)


def batch_routes(model_config: ModelConfig, train_config: TrainConfig, batch: TrainBatch):
  """The rollout routes the policy forward replays (R3 with routes in the batch), else None."""
  if (model_config.moe is None or train_config.routing_replay != "R3"
      or batch.routes is None):
    return None
  from jaxrl_sys.models.moe import Routes  # pylint: disable=import-outside-toplevel
  return Routes(batch.routes, batch.route_mask)


def token_logprobs(params, model_config: ModelConfig, train_config: TrainConfig, batch: TrainBatch,
                   moe_state=None, sampling: SamplingConfig = SAMPLING, routes=None,
                   return_routes: bool = False, lora=None, lora_rng=None):
  """Log-probs and entropy of `batch.targets` under `params` at `sampling.temperature` (with
  LoRA `lora` adapters beside them, dropout drawn from `lora_rng`), on the scoring window only
  (no logits at the prompt positions before it). `routes`: MoE routes to replay
  (`models.moe.Routes`), None routes live; `return_routes` (static) also returns the forward's.

  Returns:
    (logprobs `[rows, W]` float32, entropy `[rows, W]` float32, MoE aux dict), and the forward's
    `Routes` last when `return_routes`.
  """
  out = forward(params, model_config, batch.tokens, attention_mask=batch.attention_mask,
                moe_state=moe_state, routes=routes, return_routes=return_routes,
                unroll_layers=model_config.num_layers <= train_config.unroll_layers_max,
                lora=lora, lora_rng=lora_rng)
  rows, t, d = out.hidden.shape
  w = batch.targets.shape[1]
  hidden = out.hidden if w == t else score_window(out.hidden, batch.score_start, w)
  lp, ent = kernels.fused_logprobs(
      hidden.reshape(rows * w, d), unembedding(params, model_config),
      batch.targets.reshape(rows * w), temperature=sampling.temperature,
      chunk_size=train_config.logprob_chunk, impl=train_config.logprob_impl)
  if return_routes:
    return lp.reshape(rows, w), ent.reshape(rows, w), out.aux, out.routes
  return lp.reshape(rows, w), ent.reshape(rows, w), out.aux


def lora_rng(state: TrainState, micro: jax.Array, model_config: ModelConfig):
  """The adapters' dropout key of one micro-batch (None without LoRA dropout)."""
  if model_config.lora is None or not model_config.lora.dropout:
    return None
  return jax.random.fold_in(jax.random.fold_in(state.rng, state.step), micro)

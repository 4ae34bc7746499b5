"""Supervised warm-up on a task's reference answers (before RL), as a pure jitted step.

The warm-up puts a tiny random model in the regime where RL has signal: it learns the answer
format and part of the answers, so rewards start mid-range and GRPO can raise them.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_sys import kernels
from jaxrl_sys.models import ModelConfig, forward, unembedding
from jaxrl_sys.tasks import supervised_examples


def sft_loss(params, config: ModelConfig, tokens, attention_mask, loss_mask):
  """Token-mean negative log-likelihood of the answer tokens.

  Args:
    params: model parameters.
    config: the model config.
    tokens: `[n, T]` int32, right-padded sequences (bos + prompt + answer + eos).
    attention_mask: `[n, T]` int32.
    loss_mask: `[n, T]` 1 where the *next* token is part of the answer.

  Returns:
    float32 scalar.
  """
  n, t = tokens.shape
  h = forward(params, config, tokens, attention_mask=attention_mask).hidden
  targets = jnp.concatenate([tokens[:, 1:], jnp.zeros((n, 1), tokens.dtype)], axis=1)
  lp, _ = kernels.fused_logprobs(h.reshape(n * t, -1), unembedding(params, config),
                                 targets.reshape(-1), impl="xla")
  m = loss_mask.astype(jnp.float32).reshape(-1)
  return -jnp.sum(lp * m) / jnp.maximum(jnp.sum(m), 1.0)


@functools.partial(jax.jit, static_argnames=("config", "optimizer"), donate_argnums=(0, 1))
def sft_step(params, opt_state, tokens, attention_mask, loss_mask, *, config: ModelConfig,
             optimizer: optax.GradientTransformation):
  """One AdamW step on `sft_loss` -> (params, opt_state, loss)."""
  loss, grads = jax.value_and_grad(sft_loss)(params, config, tokens, attention_mask, loss_mask)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


@functools.lru_cache(maxsize=8)
def _sft_optimizer(learning_rate: float) -> optax.GradientTransformation:
  """One optimizer object per learning rate: `sft_step` takes it as a static argument, so a
  new object (its functions compare by identity) would compile the step again on every call."""
  return optax.adamw(learning_rate, b1=0.9, b2=0.99, weight_decay=0.0)


def supervised_warmup(params: Any, config: ModelConfig, task, tokenizer, *, steps: int,
                      batch_size: int = 32, learning_rate: float = 3e-3, seq_len: int,
                      start: int = 1_000_000, callback: Callable[[int, float], None] | None = None
                      ) -> Any:
  """Runs `steps` supervised steps on problems `start, start + 1, ...` and returns the params.

  Args:
    params: initial parameters (not modified; a copy is trained).
    config: the model config.
    task, tokenizer: the task and its tokenizer.
    steps: number of optimizer steps (0 returns `params` unchanged).
    batch_size: sequences per step.
    learning_rate: AdamW learning rate (constant).
    seq_len: padded sequence length (>= the longest prompt + answer + 2).
    start: data index of the first warm-up problem (away from the RL prompts by default).
    callback: called as `callback(step, loss)` after each step.
  """
  if steps <= 0:
    return params
  optimizer = _sft_optimizer(float(learning_rate))
  params = jax.tree.map(jnp.copy, params)
  opt_state = optimizer.init(params)
  for i in range(steps):
    b = supervised_examples(task, tokenizer, start + i * batch_size, batch_size, seq_len=seq_len)
    params, opt_state, loss = sft_step(params, opt_state, np.asarray(b.tokens),
                                       np.asarray(b.attention_mask), np.asarray(b.loss_mask),
                                       config=config, optimizer=optimizer)
    if callback is not None:
      callback(i, float(loss))
  return params

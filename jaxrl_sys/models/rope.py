"""Rotary position embeddings (half-rotation layout of Llama / Qwen), with frequency scaling."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models.config import RopeConfig


def inv_frequencies(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
  """Inverse frequencies `[head_dim // 2]` (float64 numpy) and the attention scaling factor."""
  inv = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  scale = 1.0
  if rope.type == "linear":
    inv = inv / rope.factor
  elif rope.type == "llama3":
    old = rope.original_max_position_embeddings
    low_wl = old / rope.low_freq_factor
    high_wl = old / rope.high_freq_factor
    wl = 2 * math.pi / inv
    scaled = np.where(wl > low_wl, inv / rope.factor, inv)
    smooth = (old / wl - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    mid = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_mid = (wl >= high_wl) & (wl <= low_wl)
    inv = np.where(is_mid, mid, scaled)
  elif rope.type == "yarn":
    dim = head_dim
    old = rope.original_max_position_embeddings

    def corr_dim(rot):
      return (dim * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(rope.theta))

    low = max(math.floor(corr_dim(rope.beta_fast)), 0)
    high = min(math.ceil(corr_dim(rope.beta_slow)), dim - 1)
    if low == high:
      high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrap = 1 - ramp
    inv = (inv / rope.factor) * (1 - extrap) + inv * extrap
    scale = rope.attention_factor if rope.attention_factor is not None else (
        0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0)
  return inv, scale


def rope_cos_sin(positions, rope: RopeConfig, head_dim: int, dtype=jnp.float32):
  """cos/sin tables for integer `positions [batch, seq]` -> each `[batch, seq, head_dim]`."""
  inv, scale = inv_frequencies(rope, head_dim)
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv, jnp.float32)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return (jnp.cos(emb) * scale).astype(dtype), (jnp.sin(emb) * scale).astype(dtype)


def apply_rope(x, cos, sin):
  """Rotates `x [batch, seq, heads, head_dim]` with tables `[batch, seq, head_dim]`."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]

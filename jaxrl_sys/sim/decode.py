"""Decode throughput vs batch of one rollout instance, and its plateau batch B.

Model (one continuous-batching engine, `batch` live sequences of mean context `ctx` tokens):

    gpu(batch, ctx) = fixed_s + per_seq_s * batch + per_ctx_token_s * batch * ctx       [s]
    step_time(batch, ctx) = max(host_s, gpu(batch, ctx))                              [s]
    throughput = batch / step_time                                                  [tokens/s]

`fixed_s` is what every step pays on the GPU whatever the batch (reading the weights, TP
all-reduce latency); `per_seq_s` the per-sequence compute (2 x params FLOPs); `per_ctx_token_s`
the per-sequence attention over its KV cache (KV bytes read). `host_s` is the engine's host-side
work per step (scheduling, sampling with log-probs, streaming), which SGLang's overlap scheduler
runs while the GPU computes the step before: a step takes the longer of the two, so a single
sequence decodes at `host_s` per token while a full batch's attention hides under it (the
decode's two regimes: single-sequence latency and batch throughput). Throughput rises with the
batch and plateaus at `1 / (per_seq_s + per_ctx_token_s * ctx)`; the KV cache bounds the batch
at `kv_capacity_tokens / ctx`. RLBoost tried a 2-D (batch x context) model of the measured
profile and kept a 1-D one recalibrated for the current context (RLBOOST.md 1.3); here the
context enters linearly through one term.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class DecodeCurve:
  """Step-time model of one rollout instance (see the module docstring).

  Attributes:
    fixed_s: seconds per decode step independent of the batch.
    per_seq_s: seconds per step per sequence.
    per_ctx_token_s: seconds per step per sequence per token of context.
    kv_capacity_tokens: KV-cache tokens the instance holds (0 = unbounded).
    host_s: host-side seconds per step, overlapped with the GPU's (0: none).
  """
  fixed_s: float
  per_seq_s: float
  per_ctx_token_s: float = 0.0
  kv_capacity_tokens: int = 0
  host_s: float = 0.0

  def __post_init__(self):
    if not (self.fixed_s > 0 and self.per_seq_s >= 0 and self.per_ctx_token_s >= 0
            and self.kv_capacity_tokens >= 0 and self.per_seq_s + self.per_ctx_token_s > 0
            and self.host_s >= 0):
      raise ValueError(f"DecodeCurve: need fixed_s > 0, non-negative slopes (not both 0), "
                       f"kv_capacity_tokens >= 0 and host_s >= 0; got {self}")

  def per_batch_s(self, mean_context: float = 0.0) -> float:
    """Marginal GPU seconds per step of one more sequence at this context."""
    return self.per_seq_s + self.per_ctx_token_s * mean_context

  def gpu_time(self, batch: float, mean_context: float = 0.0) -> float:
    """GPU seconds of one decode step (one token for each of `batch` sequences)."""
    if batch < 0 or mean_context < 0:
      raise ValueError(f"step_time: batch and context must be >= 0, got {batch}, "
                       f"{mean_context}")
    return self.fixed_s + self.per_batch_s(mean_context) * batch

  def step_time(self, batch: float, mean_context: float = 0.0) -> float:
    """Seconds of one decode step: the longer of the host's and the GPU's work."""
    return max(self.host_s, self.gpu_time(batch, mean_context))

  def throughput(self, batch: float, mean_context: float = 0.0) -> float:
    """Generated tokens/s at this batch and mean context."""
    return batch / self.step_time(batch, mean_context)

  def asymptote(self, mean_context: float = 0.0) -> float:
    """Tokens/s as the batch grows without bound (ignoring the KV capacity)."""
    return 1.0 / self.per_batch_s(mean_context)

  def max_batch(self, mean_context: float) -> int | None:
    """Most sequences of this mean context whose KV fits (None when unbounded)."""
    if not self.kv_capacity_tokens:
      return None
    return max(1, int(self.kv_capacity_tokens // max(mean_context, 1.0)))


def plateau_batch(curve: DecodeCurve, frac: float = 0.9, mean_context: float = 0.0,
                  max_batch: int | None = None) -> int:
  """B: the smallest batch whose throughput reaches `frac` of the best reachable one.

  The best is the throughput at `max_batch` (default: the KV-capacity bound at this context,
  or the asymptote when unbounded) - the same definition as `rollout.manager.balance.plateau_batch`
  applies to a measured profile. Throughput `b / max(h, a + k b)` (h = host_s, a = fixed_s,
  k = per_batch_s(ctx)) rises with b, so with T = frac x the best it is reached at
  B = ceil(max(T h, T a / (1 - T k))); with h = 0 and M = max_batch,
  B = ceil(frac * M * a / (a + (1 - frac) * k * M)), -> frac * a / ((1 - frac) k) as M -> inf.
  """
  if not 0 < frac < 1:
    raise ValueError(f"plateau_batch: frac must be in (0, 1), got {frac}")
  a, k, h = curve.fixed_s, curve.per_batch_s(mean_context), curve.host_s
  m = max_batch if max_batch is not None else curve.max_batch(mean_context)
  if m is not None and m < 1:
    raise ValueError(f"plateau_batch: max_batch must be >= 1, got {m}")
  target = frac / k if m is None else frac * m / max(h, a + k * m)
  b = max(target * h, target * a / (1 - target * k))
  b = max(1, math.ceil(b - 1e-9))
  return b if m is None else min(b, m)

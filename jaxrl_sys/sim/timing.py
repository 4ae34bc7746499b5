"""Durations of the simulated work: decode steps, prefills, training, per-step overhead.

Pure functions of a `ModelPreset`; every result is in seconds (or tokens/s) and grows
monotonically with the work given.
"""
from __future__ import annotations

from jaxrl_sys.sim.presets import ModelPreset


def _non_negative(**kw) -> None:
  for k, v in kw.items():
    if v < 0:
      raise ValueError(f"{k} must be >= 0, got {v}")


def decode_step_time(preset: ModelPreset, batch: int, mean_context: float = 0.0) -> float:
  """Seconds of one decode step of one rollout instance: one token for each of `batch`
  sequences whose mean context (prompt + tokens so far) is `mean_context` tokens. The KV
  capacity is not checked here: a simulated engine keeps `batch <= max_decode_batch(...)`."""
  _non_negative(batch=batch, mean_context=mean_context)
  return preset.decode.step_time(batch, mean_context)


def decode_throughput(preset: ModelPreset, batch: int, mean_context: float = 0.0) -> float:
  """Generated tokens/s of one rollout instance at this batch and mean context."""
  return batch / decode_step_time(preset, batch, mean_context) if batch else 0.0


def max_decode_batch(preset: ModelPreset, mean_context: float) -> int:
  """Sequences of this mean context whose KV cache fits one rollout instance."""
  _non_negative(mean_context=mean_context)
  return preset.decode.max_batch(mean_context) or 1 << 30


def prefill_time(preset: ModelPreset, tokens: int, seq_len: int | None = None) -> float:
  """Seconds to prefill `tokens` tokens on one rollout instance, in sequences of `seq_len`
  tokens each (default: one sequence of `tokens`) - e.g. a migrated request re-reads its
  prompt + generated tokens. Zero tokens cost nothing."""
  seq_len = tokens if seq_len is None else seq_len
  _non_negative(tokens=tokens, seq_len=seq_len)
  if tokens == 0:
    return 0.0
  return preset.prefill_call_s + tokens * (preset.prefill_s_per_token
                                           + preset.prefill_attn_s * seq_len)


def train_time(preset: ModelPreset, tokens: int, n_nodes: int | None = None,
               mean_seq_len: float = 0.0) -> float:
  """Seconds of the forward/backward work of an RL step over `tokens` tokens (prompt +
  response) on `n_nodes` reserved nodes (default the preset's): linear in tokens, inverse in
  nodes (ideal data-parallel scaling at the preset's MFU). `mean_seq_len` (tokens) adds the
  attention cost of sequences that long."""
  n_nodes = preset.train_nodes if n_nodes is None else n_nodes
  _non_negative(tokens=tokens, mean_seq_len=mean_seq_len)
  if n_nodes < 1:
    raise ValueError(f"train_time: n_nodes must be >= 1, got {n_nodes}")
  return tokens * (preset.train_s_per_token + preset.train_attn_s * mean_seq_len) / n_nodes


def train_throughput(preset: ModelPreset, n_nodes: int | None = None,
                     mean_seq_len: float = 0.0) -> float:
  """Trained tokens/s of the reserved cluster."""
  return 1.0 / train_time(preset, 1, n_nodes, mean_seq_len)


def step_overhead_time(preset: ModelPreset) -> float:
  """Seconds per RL step outside forward/backward (optimizer, weight reshard and host copy,
  train <-> rollout switch)."""
  return preset.step_overhead_s

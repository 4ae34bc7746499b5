"""Metric sinks (JSONL, TensorBoard event files, a stderr progress line, a PNG plot) and the
FLOP / MFU estimate."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Mapping, Sequence

import jax

from jaxrl_sys.models import ModelConfig

# Dense bf16 peak FLOP/s per device, by substring of `device_kind` (lower case). CPU: a nominal
# figure, so the MFU column is only a relative number there.
PEAK_FLOPS = (("h200", 989e12), ("h100", 989e12), ("a100", 312e12), ("l4", 121e12),
              ("v6", 918e12), ("v5p", 459e12), ("v5", 197e12), ("v4", 275e12), ("cpu", 1e11))


def peak_flops(device: jax.Device | None = None) -> float:
  """Nominal peak FLOP/s of one device (see PEAK_FLOPS)."""
  device = device or jax.devices()[0]
  kind = f"{device.device_kind} {device.platform}".lower()
  for name, flops in PEAK_FLOPS:
    if name in kind:
      return flops
  return 1e11


def train_flops_per_token(config: ModelConfig, seq_len: int, *, reference: bool) -> float:
  """Forward + backward FLOPs per trained token: 6 N (matmuls, N = non-embedding params +
  unembedding) + 12 L T D (attention), plus 2 N + 4 L T D for a reference forward."""
  c = config
  attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  if c.moe is None:
    mlp = 3 * c.hidden_size * c.intermediate_size
  else:
    m = c.moe
    mlp = 3 * c.hidden_size * (m.num_experts_per_tok * m.expert_intermediate_size
                               + m.num_shared_experts * m.shared_intermediate_size)
  n = c.num_layers * (attn + mlp) + c.hidden_size * c.vocab_size
  attn_scores = c.num_layers * seq_len * c.num_heads * c.head_dim
  flops = 6 * n + 12 * attn_scores
  if reference:
    flops += 2 * n + 4 * attn_scores
  return float(flops)


class MetricsLogger:
  """Writes one JSON object per step to `metrics.jsonl` and scalars to TensorBoard."""

  def __init__(self, out_dir: str | None, *, tensorboard: bool = True):
    self.out_dir = out_dir
    self.history: list[dict[str, Any]] = []
    self._jsonl = self._tb = None
    if out_dir:
      os.makedirs(out_dir, exist_ok=True)
      self._jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a", encoding="utf-8")
      if tensorboard:
        from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
        self._tb = SummaryWriter(os.path.join(out_dir, "tb"))

  def log(self, step: int, metrics: Mapping[str, Any]) -> None:
    row = {"step": int(step)}
    for k, v in metrics.items():
      if isinstance(v, (list, tuple)):
        row[k] = list(v)
      else:
        row[k] = float(v) if not isinstance(v, str) else v
    self.history.append(row)
    if self._jsonl:
      self._jsonl.write(json.dumps(row, allow_nan=True) + "\n")
      self._jsonl.flush()
    if self._tb:
      for k, v in row.items():
        if isinstance(v, float) and math.isfinite(v):
          self._tb.add_scalar(k, v, step)
      self._tb.flush()

  def close(self) -> None:
    if self._jsonl:
      self._jsonl.close()
      self._jsonl = None
    if self._tb:
      self._tb.close()
      self._tb = None


class Progress:
  """A one-line stderr progress display (`\\r` updates; a newline every `every` steps)."""

  def __init__(self, total: int, enabled: bool = True, stream=None):
    self.total, self.enabled = total, enabled
    self.stream = stream or sys.stderr
    self._t0 = time.monotonic()

  def update(self, step: int, metrics: Mapping[str, Any], newline: bool = False) -> None:
    if not self.enabled:
      return
    width = 24
    done = int(width * step / max(self.total, 1))
    bar = "#" * done + "." * (width - done)
    get = lambda k, d=float("nan"): metrics.get(k, d)  # noqa: E731
    line = (f"\r[{bar}] step {step}/{self.total} reward {get('reward_mean'):.3f}"
            f" kl {get('kl'):.4f} step {get('time_step', 0.0):.2f}s"
            f" elapsed {time.monotonic() - self._t0:.0f}s")
    self.stream.write(line + ("\n" if newline else ""))
    self.stream.flush()

  def close(self) -> None:
    if self.enabled:
      self.stream.write("\n")
      self.stream.flush()


def plot_history(history: Sequence[Mapping[str, Any]], path: str,
                 keys: Sequence[str] = ("reward_mean", "kl"), title: str = "") -> str:
  """Saves a PNG with one panel per key (x = step)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5))
  axes = [axes] if len(keys) == 1 else list(axes)
  for ax, key in zip(axes, keys):
    pts = [(h["step"], h[key]) for h in history if key in h]
    if pts:
      ax.plot(*zip(*pts), marker=".")
    ax.set_xlabel("step")
    ax.set_title(key)
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path

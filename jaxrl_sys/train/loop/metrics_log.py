"""Metric sinks (JSONL, TensorBoard event files, a stderr progress line, a PNG plot) and the
FLOP / MFU estimate."""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxrl_sys.models import ModelConfig

log = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s per device, by substring of `device_kind` (lower case). CPU: a nominal
# figure, so the MFU column is only a relative number there.
PEAK_FLOPS = (("h200", 989e12), ("h100", 989e12), ("a100", 312e12), ("l4", 121e12),
              ("v6", 918e12), ("v5p", 459e12), ("v5", 197e12), ("v4", 275e12), ("cpu", 1e11))


def _summary_writer_class():
  """tensorboardX's `SummaryWriter`, imported without torch.

  tensorboardX's writer module imports torch whenever it is installed (about 2 CPU-s and some
  hundreds of MB per process, measured with torch 2.x), only to accept torch tensors, and this
  module logs Python floats. Unless torch is already loaded, `import torch` is made to fail for
  the duration of the import (a `None` entry in `sys.modules`), and the entry is removed after.
  """
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    if sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]
  return SummaryWriter


def peak_flops(device: jax.Device | None = None) -> float:
  """Nominal peak FLOP/s of one device (see PEAK_FLOPS)."""
  device = device or jax.devices()[0]
  kind = f"{device.device_kind} {device.platform}".lower()
  for name, flops in PEAK_FLOPS:
    if name in kind:
      return flops
  return 1e11


def train_flops_per_token(config: ModelConfig, seq_len: int, *, reference: bool,
                          scored_len: int | None = None) -> float:
  """Forward + backward FLOPs per trained position: 6 N (matmuls, N = non-embedding params +
  unembedding) + 12 L T D (attention), plus 2 N + 4 L T D for a reference forward. With
  `scored_len` (the scoring window, see `batch.pack`) the unembedding counts only for that share
  of the `seq_len` positions."""
  c = config
  attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  if c.moe is None:
    mlp = 3 * c.hidden_size * c.intermediate_size
  else:
    m = c.moe
    mlp = 3 * c.hidden_size * (m.num_experts_per_tok * m.expert_intermediate_size
                               + m.num_shared_experts * m.shared_intermediate_size)
  share = 1.0 if scored_len is None else min(scored_len / seq_len, 1.0)
  n = c.num_layers * (attn + mlp) + c.hidden_size * c.vocab_size * share
  attn_scores = c.num_layers * seq_len * c.num_heads * c.head_dim
  flops = 6 * n + 12 * attn_scores
  if reference:
    flops += 2 * n + 4 * attn_scores
  return float(flops)


class MetricsLogger:
  """Writes one JSON object per step to `metrics.jsonl` and scalars to TensorBoard (`tb/`).

  A resumed run replays the steps after its checkpoint; `keep_until(step)` makes each step
  keep one record, the latest: it drops the later rows of `metrics.jsonl`, and the TensorBoard
  writer (opened at the first `log`) starts its event file with TensorBoard's purge marker (a
  SessionLog START event at `step + 1`), so TensorBoard discards the earlier run's events at
  steps >= `step + 1`.
  """

  def __init__(self, out_dir: str | None, *, tensorboard: bool = True):
    self.out_dir = out_dir
    self.history: list[dict[str, Any]] = []
    self._jsonl = self._tb = None
    self._tb_dir: str | None = None
    self._purge_step: int | None = None
    if out_dir:
      os.makedirs(out_dir, exist_ok=True)
      self._jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a", encoding="utf-8")
      if tensorboard:
        self._tb_dir = os.path.join(out_dir, "tb")

  def _writer(self):
    """The TensorBoard writer, opened on first use (after `keep_until` set the purge step)."""
    if self._tb is None and self._tb_dir is not None:
      SummaryWriter = _summary_writer_class()  # pylint: disable=invalid-name
      # The file name's own stamp is whole seconds (a resumed run started within the same
      # second would truncate the earlier file): nanoseconds after it keep names unique and in
      # start order, the order TensorBoard reads them in.
      self._tb = SummaryWriter(self._tb_dir, purge_step=self._purge_step,
                               filename_suffix=f".{time.time_ns():020d}")
    return self._tb

  def keep_until(self, step: int) -> int:
    """Drops the rows of `metrics.jsonl` after `step` (a resumed run replays those steps, so
    each step keeps one row: the latest). Rewrites the file atomically; returns the rows
    dropped. A torn last line (a run killed mid-write) is dropped too. TensorBoard events of
    an earlier run at steps > `step` are purged (see the class docstring)."""
    if self._tb_dir is not None and os.path.isdir(self._tb_dir) and os.listdir(self._tb_dir):
      if self._tb is None:
        self._purge_step = step + 1
      else:  # already writing: the marker goes into the open event file
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # pylint: disable=import-outside-toplevel
        self._tb.file_writer.add_event(
            Event(step=step + 1, session_log=SessionLog(status=SessionLog.START)))
    if not self._jsonl:
      return 0
    path = self._jsonl.name
    self._jsonl.close()
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
      for line in f:
        if not line.strip():
          continue
        try:
          row_step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
          dropped += 1
          continue
        if row_step <= step:
          kept.append(line if line.endswith("\n") else line + "\n")
        else:
          dropped += 1
    if dropped:
      tmp = path + ".tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
      os.replace(tmp, path)
    self._jsonl = open(path, "a", encoding="utf-8")
    return dropped

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
    tb = self._writer()
    if tb:
      for k, v in row.items():
        if isinstance(v, float) and math.isfinite(v):
          tb.add_scalar(k, v, step)
      tb.flush()

  def close(self) -> None:
    if self._jsonl:
      self._jsonl.close()
      self._jsonl = None
    if self._tb:
      self._tb.close()
      self._tb = None


class Progress:
  """The stderr progress bar (tqdm) of a run, plus its one-line messages.

  The bar appears as soon as the object is made, with a phase label ("starting", "supervised
  warm-up", "compiling...", then "training") and, on a terminal, a clock that keeps ticking
  while a phase compiles; `update` moves it to a step and shows reward / KL. `message` prints a
  line above the bar (or on its own when the bar is off and `messages` is on; else it only
  logs).

  Args:
    total: number of train steps.
    enabled: show the bar.
    stream: where to write (default stderr).
    messages: print `message` lines (default: `enabled`).
    start: the step the run starts from (a resumed run).
  """

  def __init__(self, total: int, enabled: bool = True, stream=None, messages: bool | None = None,
               start: int = 0):
    self.total, self.enabled = total, enabled
    self.messages = enabled if messages is None else messages
    self.stream = stream or sys.stderr
    self._bar = None
    self._ticker = None
    self._closed = threading.Event()
    if enabled:
      from tqdm import tqdm  # pylint: disable=import-outside-toplevel
      self._bar = tqdm(total=total, initial=start, desc="starting", file=self.stream,
                       dynamic_ncols=True, leave=True, unit="step",
                       bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}"
                                  "{postfix}")
      if getattr(self.stream, "isatty", lambda: False)():  # a log file gets no clock ticks
        self._ticker = threading.Thread(target=self._tick, daemon=True, name="progress")
        self._ticker.start()

  def _tick(self) -> None:
    while not self._closed.wait(1.0):
      bar = self._bar
      if bar is not None:
        bar.refresh()

  def phase(self, text: str) -> None:
    """Labels what the run is doing now (e.g. "compiling...")."""
    if self._bar is not None:
      self._bar.set_description_str(text)

  def message(self, text: str) -> None:
    """A line for the user (resume decisions, warnings, where the outputs go)."""
    log.info("%s", text)
    if not self.messages:
      return
    if self._bar is not None:
      self._bar.write(text, file=self.stream)
    else:
      self.stream.write(text + "\n")
      self.stream.flush()

  def update(self, step: int, metrics: Mapping[str, Any], newline: bool = False) -> None:
    """Moves the bar to `step`; with `newline`, also prints the step's summary line."""
    if self._bar is None:
      return
    get = lambda k, d=float("nan"): metrics.get(k, d)  # noqa: E731
    summary = f"reward {get('reward_mean'):.3f} kl {get('kl'):.4f}"
    if "eval_reward" in metrics:
      summary += f" eval {get('eval_reward'):.3f}"
    self._bar.set_description_str("training")
    self._bar.set_postfix_str(f"{summary} {get('time_step', 0.0):.2f}s/step", refresh=False)
    self._bar.update(step - self._bar.n)
    if newline:
      self._bar.write(f"step {step}/{self.total} {summary}", file=self.stream)

  def close(self) -> None:
    self._closed.set()
    if self._bar is not None:
      self._bar.close()
      self._bar = None


def plot_history(history: Sequence[Mapping[str, Any]], path: str,
                 keys: Sequence[str | Sequence[str]] = ("reward_mean", "kl"),
                 title: str = "") -> str:
  """Saves a PNG with one panel per entry of `keys` (x = step); an entry that is a tuple of
  keys draws them in one panel with a legend (e.g. ("reward_mean", "eval_reward"))."""
  # A bare Figure, not pyplot: the caller's backend (a notebook's inline one) stays as it is.
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  fig = Figure(figsize=(5 * len(keys), 3.5))
  axes = fig.subplots(1, len(keys))
  axes = [axes] if len(keys) == 1 else list(axes)
  for ax, panel in zip(axes, keys):
    series = (panel,) if isinstance(panel, str) else tuple(panel)
    for key in series:
      pts = [(h["step"], h[key]) for h in history if key in h]
      if pts:
        ax.plot(*zip(*pts), marker=".", label=key)
    if len(series) > 1:
      ax.legend()
    ax.set_xlabel("step")
    ax.set_title(" / ".join(series))
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  return path


def step_row(metrics: Mapping[str, Any], stats, *, version: int, t_roll: float, t_train: float,
             t_step: float, devices: int, flops_per_token: float, next_prompt: int) -> dict:
  """One step's metrics row: the step's device metrics (host values) plus the rollout
  statistics of its groups (`step_stats.StepStats`), timings, throughputs and MFU; `version` is
  the weight version the step trained from."""
  rewards, lengths, stopped, versions = (stats.rewards, stats.lengths, stats.stopped,
                                         stats.versions)
  gen_tokens = int(lengths.sum())
  trained = stats.trained_positions
  row = {k: (float(v) if np.ndim(v) == 0 else np.asarray(v).tolist())
         for k, v in metrics.items()}
  row.update(
      reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
      reward_max=float(rewards.max()), response_len_mean=float(lengths.mean()),
      response_len_max=float(lengths.max()), stop_frac=float(stopped.mean()),
      zero_variance_frac=stats.zero_variance / max(len(stats.group_ids), 1),
      off_policy_token_frac_host=float((versions < version).mean()) if versions.size else 0.0,
      token_staleness_max=int(version - versions.min()) if versions.size else 0,
      time_rollout=t_roll, time_train=t_train, time_step=t_step,
      tokens_per_s=gen_tokens / max(t_step, 1e-9),
      rollout_tokens_per_s=gen_tokens / max(t_roll, 1e-9),
      train_positions=trained,
      train_tokens_per_s=trained / max(t_train, 1e-9),
      mfu=flops_per_token * trained / max(t_train, 1e-9) / (peak_flops() * devices),
      next_prompt=next_prompt)
  return row


# The rollout metrics that count work: in a multi-process run each process's client counts its
# own share, and the row holds their sum over the processes.
SUMMED_COUNTS = ("rollout_migrated", "rollout_tokens_kept", "rollout_balanced", "rollout_joined",
                 "rollout_lost", "rollout_tokens", "weight_pulls", "live_workers")


def rollout_metrics(before: dict, after: dict) -> dict:
  """Per-step rollout metrics: counter differences over the step plus the gauges."""
  out = {}
  for key in ("migrated", "tokens_kept", "balanced", "joined", "lost", "tokens"):
    if key in after:
      out[f"rollout_{key}"] = after[key] - before.get(key, 0)
  n_pulls = after.get("pulls", 0) - before.get("pulls", 0)
  if n_pulls:
    out["weight_pulls"] = n_pulls
    out["weight_pull_bytes"] = after.get("load_bytes", 0) - before.get("load_bytes", 0)
    out["weight_pull_s_mean"] = (after["pull_seconds"] - before.get("pull_seconds", 0.0)) / n_pulls
  for key in ("live_workers", "version_lag"):
    if key in after:
      out[key] = after[key]
  out.update(agent_metrics(before, after))
  return out


def agent_metrics(before: dict, after: dict) -> dict:
  """Per-step metrics of multi-turn episodes (`agents.EpisodeDriver`'s `agent_*` counters):
  each counter's difference over the step, and the rates: `episode_success` (episodes that
  solved their problem), `episode_turns` (policy turns per episode), `tool_error_frac` (calls
  that did not end `ok`), `prefetch_hit_frac` (speculative calls used)."""
  d = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith("agent_")}
  if not d:
    return {}
  done = d.get("agent_episodes_done", 0.0)
  calls = d.get("agent_tool_calls", 0.0)
  started = d.get("agent_prefetch_started", 0.0)
  d.update(episode_success=d.get("agent_episode_success", 0.0) / max(done, 1.0),
           episode_turns=d.get("agent_episode_turns", 0.0) / max(done, 1.0),
           tool_error_frac=(calls - d.get("agent_tool_ok", 0.0)) / max(calls, 1.0),
           prefetch_hit_frac=d.get("agent_prefetch_hits", 0.0) / max(started, 1.0))
  return d

"""Size limits checked before any compilation: the prompt-length bucket of a data set, the
memory a prompt length implies, and the number of fake CPU devices a mesh may ask for.

Default prompt bucket of a data set (`--max_prompt_len` not given): the longest prompt, but at
most `OUTLIER_FACTOR` times the 99th-percentile length (one outlier does not set the bucket of
every row), at most `MAX_DEFAULT_PROMPT_LEN` tokens, and at most the model's context minus the
response budget. Prompts longer than the bucket (default or given) are dropped with a
count; when more than half the rows would go, the run is refused instead, with the row index and
the first 80 characters of the first long prompt.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

MAX_DEFAULT_PROMPT_LEN = 2048
PROMPT_QUANTILE = 0.99
OUTLIER_FACTOR = 4
# More fake CPU devices than this: XLA compiles every program for each of them (minutes).
MAX_FAKE_CPU_DEVICES = 512
SLOW_FAKE_CPU_DEVICES = 128


def default_prompt_len(lengths: Sequence[int], context: int | None = None) -> int:
  """The default prompt bucket for prompts of `lengths` tokens (see the module docstring).

  Args:
    lengths: tokens per prompt (bos and chat template included), at least one.
    context: the most prompt tokens the model can take (None = no limit).
  """
  arr = np.asarray(lengths, np.int64)
  longest = int(arr.max())
  q = int(np.quantile(arr, PROMPT_QUANTILE, method="lower"))
  n = min(longest, OUTLIER_FACTOR * q)
  n = min(n, MAX_DEFAULT_PROMPT_LEN)
  if context is not None:
    n = min(n, context)
  return max(n, 1)


def long_prompts(lengths: Sequence[int], max_len: int) -> list[int]:
  """Row indices whose prompt is longer than `max_len` tokens."""
  return [i for i, n in enumerate(lengths) if n > max_len]


def check_dropped(prompts: Sequence[str], lengths: Sequence[int], max_len: int,
                  flag: str) -> str | None:
  """A one-line note on the rows longer than `max_len` (None if none).

  Raises:
    ValueError: more than half the rows are longer (the message shows the first one's row
      index, length and first 80 characters, never the whole prompt).
  """
  bad = long_prompts(lengths, max_len)
  if not bad:
    return None
  i = bad[0]
  first = (f"row {i} ({lengths[i]} tokens): {prompts[i][:80]!r}"
           + (f"... ({len(prompts[i])} characters)" if len(prompts[i]) > 80 else ""))
  if 2 * len(bad) > len(lengths):
    raise ValueError(
        f"{len(bad)} of {len(lengths)} prompts are longer than {flag}={max_len} tokens; first "
        f"{first}. Raise {flag} (within the model's context) or shorten the prompts")
  return (f"dropped {len(bad)} of {len(lengths)} prompts longer than {flag}={max_len} tokens "
          f"(first {first}); raise {flag} to keep them")


def available_memory_bytes(device) -> int | None:
  """Memory of one device: the accelerator's limit, or the host's RAM for a CPU device."""
  if device.platform == "cpu":
    try:
      return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
      return None
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    return None
  return stats.get("bytes_limit")


def min_step_bytes(model_config, rows: int, seq_len: int, *, platform: str) -> int:
  """A lower bound on the memory one train micro-batch needs: the layer activations kept for
  the backward pass (rows x seq x hidden x layers, float32) and, where attention is XLA's
  (CPU, or `attention_impl="xla"`), one layer's attention scores (rows x heads x seq^2)."""
  c = model_config
  acts = rows * seq_len * c.hidden_size * c.num_layers * 4
  xla_attention = c.attention_impl == "xla" or (c.attention_impl == "auto" and platform != "gpu")
  scores = rows * c.num_heads * seq_len * seq_len * 4 if xla_attention else 0
  return int(acts + scores)


def check_memory(model_config, rows: int, seq_len: int, device) -> None:
  """Raises ValueError when a micro-batch of `rows` x `seq_len` tokens cannot fit `device`
  (by `min_step_bytes`, a lower bound: passing is no promise, failing is certain)."""
  have = available_memory_bytes(device)
  need = min_step_bytes(model_config, rows, seq_len, platform=device.platform)
  if have is not None and need > have:
    raise ValueError(
        f"a train micro-batch of {rows} rows x {seq_len} tokens (--max_prompt_len + "
        f"--max_new_tokens) needs at least {_gib(need)} on one device; {device.platform} has "
        f"{_gib(have)}. Lower --max_prompt_len (or --micro_batch_groups)")


def _gib(n: int) -> str:
  return f"{n / 2**30:,.1f} GiB" if n < 2**40 else f"{n / 2**40:,.1f} TiB"


def check_fake_devices(needed: int, present: int, platform: str) -> None:
  """Raises ValueError when a mesh of `needed` devices cannot run on the `present` devices of
  `platform` because it would need more than MAX_FAKE_CPU_DEVICES fake CPU devices."""
  if needed <= present:
    return
  if needed > MAX_FAKE_CPU_DEVICES:
    raise ValueError(
        f"--mesh needs {needed} devices and this machine has {present} {platform} device(s): "
        f"faking more than {MAX_FAKE_CPU_DEVICES} CPU devices is refused (XLA compiles every "
        "program for each fake device: minutes to hours before the first step). Use a smaller "
        "--mesh to test sharding on CPU, or run on that many accelerators")


def fake_devices_note(needed: int) -> str | None:
  """The warning for a mesh that fakes more than SLOW_FAKE_CPU_DEVICES CPU devices."""
  if SLOW_FAKE_CPU_DEVICES < needed <= MAX_FAKE_CPU_DEVICES:
    return (f"warning: --mesh needs {needed} devices; on CPU they are faked, and compiling "
            f"each program for {needed} devices takes minutes before the first step")
  return None

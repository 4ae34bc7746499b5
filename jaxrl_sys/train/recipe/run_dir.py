"""Run directories: one directory per run, never silently shared with an earlier run.

A run directory holds `config.json`, `metrics.jsonl`, `tb/` (TensorBoard), `reward_kl.png`,
`checkpoints/` (unless `--checkpoint_dir` points elsewhere), `final_params.npz` and, with
`--export_hf`, the Hugging Face export. `new_run_dir` names a fresh one; `prepare_run_dir`
refuses a directory that already holds a run unless the run is resumed (its outputs continue)
or `overwrite` is set (the earlier run's outputs are deleted first).
"""
from __future__ import annotations

import json
import os
import shutil
import time

# What a run writes into its directory (the only entries `overwrite` deletes).
RUN_FILES = ("config.json", "metrics.jsonl", "reward_kl.png", "offload.png", "final_params.npz")
RUN_DIRS = ("tb", "checkpoints", "hf")


def check_directory_path(path: str, flag: str) -> str:
  """The absolute path; raises ValueError when `path` exists and is not a directory."""
  path = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag}={path} is a file, not a directory: give a directory path (it is "
                     "created when missing)")
  parent = os.path.dirname(path)
  while parent and not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if parent and not os.path.isdir(parent):
    raise ValueError(f"{flag}={path}: {parent} is a file, so the directory cannot be created")
  return path


def new_run_dir(root: str = "runs", prefix: str = "grpo") -> str:
  """A path `root/prefix-YYYYmmdd-HHMMSS` that does not exist yet (suffix -2, -3, ... if so)."""
  base = os.path.join(root, f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")
  path, n = base, 1
  while os.path.exists(path):
    n += 1
    path = f"{base}-{n}"
  return path


def previous_run_entries(path: str) -> list[str]:
  """The run outputs already present in `path` (empty for a new or unrelated directory)."""
  if not os.path.isdir(path):
    return []
  return sorted(e for e in os.listdir(path) if e in RUN_FILES + RUN_DIRS)


def prepare_run_dir(path: str, *, overwrite: bool = False, resume: bool = False) -> str:
  """Creates or validates the run directory and returns its absolute path.

  Args:
    path: the run directory.
    overwrite: delete an earlier run's outputs (only the entries of RUN_FILES / RUN_DIRS).
    resume: the run continues the one in `path` (its outputs are kept and appended to).

  Raises:
    ValueError: `path` is a file, or holds an earlier run and neither flag is set.
  """
  path = check_directory_path(path, "--out_dir")
  found = previous_run_entries(path)
  if found and not resume:
    if not overwrite:
      raise ValueError(
          f"--out_dir={path} already holds a run ({', '.join(found)}); pass --overwrite to "
          "replace it, --resume to continue it, or another --out_dir (without --out_dir each "
          "run gets a new directory under runs/)")
    for name in found:
      target = os.path.join(path, name)
      if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
      else:
        os.remove(target)
  os.makedirs(path, exist_ok=True)
  return path


def _size(path: str) -> str:
  n = os.path.getsize(path)
  for unit in ("B", "KB", "MB", "GB"):
    if n < 1024 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n} B"


def describe_outputs(run_dir: str, *, checkpoint_dir: str | None = None,
                     export_dir: str | None = None) -> list[str]:
  """One line per output present: what it is and where (for the end-of-run summary)."""
  lines = []
  j = lambda *p: os.path.join(run_dir, *p)  # noqa: E731
  if os.path.exists(j("metrics.jsonl")):
    with open(j("metrics.jsonl"), encoding="utf-8") as f:
      rows = sum(1 for line in f if line.strip())
    lines.append(f"metrics      {j('metrics.jsonl')} ({rows} rows)")
  if os.path.isdir(j("tb")):
    lines.append(f"tensorboard  {j('tb')} (tensorboard --logdir {j('tb')})")
  for name in ("reward_kl.png", "offload.png"):
    if os.path.exists(j(name)):
      lines.append(f"plot         {j(name)}")
  ckpt = checkpoint_dir or j("checkpoints")
  if os.path.isdir(ckpt):
    steps = sorted(int(d) for d in os.listdir(ckpt) if d.isdigit())
    if steps:
      lines.append(f"checkpoints  {ckpt} (steps {steps})")
  if os.path.exists(j("final_params.npz")):
    lines.append(f"parameters   {j('final_params.npz')} ({_size(j('final_params.npz'))})")
  if export_dir and os.path.isdir(export_dir):
    lines.append(f"hf export    {export_dir} (transformers.AutoModelForCausalLM"
                 ".from_pretrained)")
  if os.path.exists(j("config.json")):
    lines.append(f"config       {j('config.json')} (rerun: --config={j('config.json')})")
  return lines


def write_json(path: str, data: dict) -> None:
  """Writes `data` as indented JSON atomically (temporary file + rename)."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)

"""Run directories: one directory per run, never silently shared with an earlier run.

A run directory holds `config.json`, `metrics.jsonl`, `tb/` (TensorBoard), `reward_kl.png`,
`checkpoints/` (unless `--checkpoint_dir` points elsewhere), `final_params.npz` and, with
`--export_hf`, the Hugging Face export. `new_run_dir` names a fresh one; `prepare_run_dir`
refuses a directory that already holds a run unless the run is resumed (its outputs continue)
or `overwrite` is set (the earlier run's outputs are deleted first). `claim_run_dir` also
takes the directory's lock (`train.run_lock`) before touching anything, so a running job's
outputs are never deleted or appended to by another run; `claim_output_dir` does the same for
every other directory a run writes (its checkpoint directory, inside the run directory or not,
the `--export_hf` directory, a local tensorstore weight store): a second run pointed at any of
them (`--checkpoint_dir=<a live run>/checkpoints --resume`) is refused while the first lives.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from typing import Callable

from jaxrl_sys.train.recipe.run_lock import LOCK_NAME, RunLock

import jax
import jax.numpy as jnp
import numpy as np

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
  _check_writable(path if os.path.isdir(path) else parent, path, flag)
  return path


def _check_writable(existing: str, path: str, flag: str) -> None:
  """Creates and removes a probe directory in `existing` (the directory itself or its nearest
  existing parent): read-only mounts, permissions and pseudo file systems (/proc) fail here,
  with a message, instead of as an OSError mid-run."""
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=existing))
  except OSError as e:
    why = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
           errno.EPERM: "operation not permitted"}.get(e.errno, e.strerror or str(e))
    where = "" if existing == path else f" (its parent {existing} exists)"
    raise ValueError(f"{flag}={path}: cannot write there{where}: {why}; give a writable "
                     "directory") from None


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

  def holds_output(name: str) -> bool:
    if name in RUN_FILES:
      return True
    full = os.path.join(path, name)  # a run directory's subdirectory: empty ones (but for a
    return name in RUN_DIRS and (not os.path.isdir(full) or any(  # lock) hold nothing
        e != LOCK_NAME for e in os.listdir(full)))

  return sorted(e for e in os.listdir(path) if holds_output(e))


RESUME_OVERWRITE = ("--resume continues the run in --out_dir and --overwrite deletes it: pass "
                    "one of them (--overwrite alone starts the run again from scratch)")


def claim_run_dir(path: str, *, overwrite: bool = False, resume: bool = False,
                  message: Callable[[str], None] | None = None) -> tuple[str, RunLock]:
  """Creates or validates the run directory, takes its lock, and returns (absolute path,
  the held lock; release it when the run ends).

  Args:
    path: the run directory.
    overwrite: delete an earlier run's outputs (only the entries of RUN_FILES / RUN_DIRS).
    resume: the run continues the one in `path` (its outputs are kept and appended to).
    message: receives the line saying that a stale lock was reclaimed.

  Raises:
    ValueError: `path` is a file or not writable, holds an earlier run and neither flag is
      set, or both flags are set.
    run_lock.RunDirLockedError: a live run holds the directory (nothing is touched).
  """
  if overwrite and resume:
    raise ValueError(RESUME_OVERWRITE)
  path = check_directory_path(path, "--out_dir")
  os.makedirs(path, exist_ok=True)
  lock = RunLock(path, message)
  lock.acquire()
  try:
    found = previous_run_entries(path)
    if found and not resume:
      if not overwrite:
        raise ValueError(
            f"--out_dir={path} already holds a run ({', '.join(found)}); pass --overwrite to "
            "replace it, --resume to continue it, or another --out_dir (without --out_dir each "
            "run gets a new directory under runs/)")
      for name in sorted(e for e in os.listdir(path) if e in RUN_FILES + RUN_DIRS):
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
          shutil.rmtree(target)
        else:
          os.remove(target)
  except BaseException:
    lock.release()
    raise
  return path, lock


def claim_output_dir(directory: str | None, flag: str, *,
                     message: Callable[[str], None] | None = None) -> RunLock | None:
  """Takes the lock of a directory a run writes besides its run directory (checkpoints, the
  export, a local weight store): two runs writing into one directory overwrite and garbage-
  collect each other's files. Returns the held lock (release it when the run ends), or None
  when `directory` is unset.

  Raises:
    run_lock.RunDirLockedError: a live run holds the directory (nothing is touched); a stale
      lock of a dead run is reclaimed with a `message`.
  """
  if not directory:
    return None
  directory = os.path.abspath(os.path.expanduser(directory))
  os.makedirs(directory, exist_ok=True)
  lock = RunLock(directory, message)
  lock.acquire(flag=flag)
  return lock


def claim_checkpoint_dir(directory: str | None, run_dir: str | None, *,
                         message: Callable[[str], None] | None = None) -> RunLock | None:
  """`claim_output_dir` of the run's checkpoint directory: `directory`, else `run_dir`'s
  `checkpoints/` (its own lock too: another run may be pointed at it by --checkpoint_dir)."""
  if not directory and run_dir is not None:
    directory = os.path.join(run_dir, "checkpoints")
  return claim_output_dir(directory, "--checkpoint_dir", message=message)


def local_store_dir(spec: str | None) -> str | None:
  """The directory of a `tensorstore:PATH` (or `tensorstore:file://PATH`) weight store, None for
  any other store (memory, Ray, a remote URL)."""
  if not spec or not spec.startswith("tensorstore:"):
    return None
  path = spec.split(":", 1)[1]
  if path.startswith("file://"):
    path = path[len("file://"):]
  return path if path and "://" not in path else None


def prepare_run_dir(path: str, *, overwrite: bool = False, resume: bool = False) -> str:
  """`claim_run_dir` without keeping the lock (checks and clean-up only)."""
  path, lock = claim_run_dir(path, overwrite=overwrite, resume=resume)
  lock.release()
  return path


EXPORT_MARK = ".jaxrl_run.json"


def check_export_dir(path: str | None, run_dir: str | None, *, overwrite: bool,
                     resume: bool, flag: str = "--export_hf") -> None:
  """Refuses, before any work, an export directory (`flag`: --export_hf, --export_peft) that
  is not empty, unless `overwrite` or it is this run's own earlier export (`--resume` of a
  run that exported; see `mark_export_dir`)."""
  if not path or overwrite:
    return
  path = os.path.abspath(path)
  entries = [e for e in os.listdir(path) if e != LOCK_NAME] if os.path.isdir(path) else []
  if not entries:  # its lock file (this run's, or a dead one's) is no content
    return
  if resume and run_dir is not None:
    try:
      with open(os.path.join(path, EXPORT_MARK), encoding="utf-8") as f:
        if json.load(f).get("run_dir") == os.path.abspath(run_dir):
          return
    except (OSError, ValueError, AttributeError):
      pass
  raise ValueError(f"{flag}={path} is not empty ({len(entries)} entries); choose a "
                   "new directory or pass --overwrite (checked before training, nothing was "
                   "run)")


def mark_export_dir(path: str, run_dir: str) -> None:
  """Notes in an export directory which run wrote it (so a resumed run may replace it)."""
  write_json(os.path.join(path, EXPORT_MARK), {"run_dir": os.path.abspath(run_dir)})


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


def save_tree(path: str, tree) -> None:
  """Writes a pytree of nested dicts as one safetensors file ("layers/attn/wq" -> array), in
  its own dtypes (bfloat16 included), atomically: what `load_tree` reads back bit for bit."""
  from jaxrl_sys.models.hf import safetensors_io  # pylint: disable=import-outside-toplevel
  flat = {"/".join(str(getattr(k, "key", k)) for k in kp): np.asarray(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}
  tmp = path + ".tmp"
  safetensors_io.write_file(tmp, flat)
  os.replace(tmp, path)


def load_tree(path: str) -> dict:
  """The nested dict `save_tree` wrote (numpy arrays)."""
  from jaxrl_sys.models.hf import safetensors_io  # pylint: disable=import-outside-toplevel
  out: dict = {}
  for name, arr in safetensors_io.read_file(path).items():
    node = out
    *parents, leaf = name.split("/")
    for k in parents:
      node = node.setdefault(k, {})
    node[leaf] = arr
  return out


def save_params(path: str, params) -> None:
  """Writes the parameters as a flat .npz ("layers/attn/wq" -> array), no pickles, readable by
  plain `numpy.load`: floating leaves numpy has no dtype for (bfloat16 masters) are written as
  float32 (exact), never as the opaque `V2` void arrays numpy would store them as."""
  def host(v):
    a = np.asarray(v)
    small = jnp.issubdtype(a.dtype, jnp.floating) and a.dtype.itemsize < 4
    return a.astype(np.float32) if small else a
  flat = {"/".join(str(getattr(k, "key", k)) for k in kp): host(v)
          for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  tmp = path + ".tmp.npz"
  np.savez(tmp, **flat)
  os.replace(tmp, path)

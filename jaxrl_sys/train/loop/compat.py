"""Does a checkpoint belong to this run? Config and state-layout comparison for `--resume`.

A checkpoint written by another configuration (another model, algorithm, task, ...) is not
corrupt: restoring it must fail with an error that names what differs, and must never move
the checkpoint aside. Two records are compared, both stored in the checkpoint's metadata:

  run identity: the fields of the run config that define what is being trained (model, task,
    algorithm, sampling, seed, ...; see `recipe.identity`), as a JSON dict;
  state layout: `{leaf path: [shape, dtype]}` of every state leaf.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax


class CheckpointMismatchError(ValueError):
  """The checkpoint was written by a run with another configuration or state layout."""


def state_layout(state: Any) -> dict[str, list]:
  """`{path: [shape, dtype name]}` of every leaf of `state` (arrays or ShapeDtypeStructs)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    out[jax.tree_util.keystr(path)] = [list(leaf.shape), str(leaf.dtype)]
  return out


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def identity_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
  """"field: checkpoint X, this run Y" for every field present in both that differs."""
  out = []
  for key in sorted(set(saved) & set(current)):
    if saved[key] != current[key]:
      out.append(f"{key}: checkpoint {_short(saved[key])}, this run {_short(current[key])}")
  return out


def layout_differences(saved: Mapping[str, list], current: Mapping[str, list],
                       limit: int = 8) -> list[str]:
  """Leaves missing on either side or differing in shape / dtype (at most `limit` named)."""
  out = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key), current.get(key)
    if a is None:
      out.append(f"{key}: not in the checkpoint")
    elif b is None:
      out.append(f"{key}: in the checkpoint but not in this run's state")
    elif [list(a[0]), a[1]] != [list(b[0]), b[1]]:
      out.append(f"{key}: checkpoint {tuple(a[0])} {a[1]}, this run {tuple(b[0])} {b[1]}")
  if len(out) > limit:
    out = out[:limit] + [f"... and {len(out) - limit} more"]
  return out


def check_compatible(step: int, directory: str, meta: Mapping[str, Any],
                     identity: Mapping[str, Any] | None, layout: Mapping[str, list],
                     base_digest: str | None = None) -> None:
  """Raises `CheckpointMismatchError` when checkpoint `step`'s metadata does not fit this run.

  Args:
    step, directory: name the checkpoint in the message.
    meta: the checkpoint's metadata (may lack "identity" / "layout": older checkpoints).
    identity: this run's identity fields (None: not compared).
    layout: `state_layout` of this run's restore target.
    base_digest: with LoRA, `models.lora.base_digest` of this run's frozen base; the
      checkpoint's adapters (meta "lora_base") were trained on one base and are refused on
      another.
  """
  saved_base = meta.get("lora_base")
  if base_digest is not None and saved_base is not None and saved_base != base_digest:
    raise CheckpointMismatchError(
        f"the checkpoint at step {step} in {directory} holds LoRA adapters trained on another "
        f"base model (base digest {saved_base}; this run's base is {base_digest}): adapters "
        "are only meaningful on the base they were trained on. Resume with the same --model "
        "(the same weights), or start a new run in another --checkpoint_dir / --out_dir (the "
        "checkpoints were left untouched).")
  diffs = []
  if identity is not None and meta.get("identity") is not None:
    diffs += identity_differences(meta["identity"], identity)
  if meta.get("layout") is not None:
    leaves = layout_differences(meta["layout"], layout, limit=10**9)
    if diffs and leaves:  # the settings explain it; the leaves would only be noise
      diffs.append(f"(and so {len(leaves)} state arrays differ in shape or presence)")
    elif leaves:
      diffs += layout_differences(meta["layout"], layout)
  if diffs:
    raise CheckpointMismatchError(
        f"the checkpoint at step {step} in {directory} was written by a different run "
        "configuration:\n  " + "\n  ".join(diffs) + "\nResume with the settings it was written "
        "with, or start a new run in another --checkpoint_dir / --out_dir (the checkpoints "
        "were left untouched).")

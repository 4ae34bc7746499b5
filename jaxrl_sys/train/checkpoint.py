"""Orbax checkpoints of the train state plus the loop's host state, with corruption fallback.

One checkpoint step holds two items:
  state: the `TrainState` leaves (params, optimizer, reference copy, MoE balancing state, rng,
    step), written by `StandardSave` (asynchronously by default);
  meta: JSON: the step, a fingerprint of every state leaf, and the loop's host state (data
    position, admission counters, the serialised rollout buffer: plain arrays + JSON).

Restoring takes a target of ShapeDtypeStructs carrying the *new* shardings, so a checkpoint
written on one mesh restores onto any other. The latest step is tried first; if orbax raises
(truncated or missing files) or the fingerprint differs (silent corruption), the step directory
is renamed aside with a warning and the previous step is tried.
"""
from __future__ import annotations

import logging
import os
import time
from typing import NamedTuple

import jax
import orbax.checkpoint as ocp

from jaxrl_sys.train.config import CheckpointConfig
from jaxrl_sys.train.state import TrainState
from jaxrl_sys.utils.fingerprint import fingerprint

log = logging.getLogger(__name__)
_FIELDS = TrainState._fields


class Restored(NamedTuple):
  """A restored checkpoint: the step, the state (on the target's shardings), the host dict."""
  step: int
  state: TrainState
  host: dict


class CorruptCheckpointError(RuntimeError):
  """A checkpoint whose contents do not match the fingerprint stored beside it."""


def state_to_dict(state: TrainState) -> dict:
  """The state as a dict without its None fields (orbax writes no empty items)."""
  return {k: v for k, v in state._asdict().items() if v is not None}


def state_from_dict(d: dict) -> TrainState:
  return TrainState(**{k: d.get(k) for k in _FIELDS})


class Checkpointer:
  """Async orbax `CheckpointManager` with keep-last-K, fingerprints and fallback on restore."""

  def __init__(self, config: CheckpointConfig):
    if config.directory is None:
      raise ValueError("Checkpointer needs CheckpointConfig.directory")
    self.config = config
    self.directory = os.path.abspath(config.directory)
    os.makedirs(self.directory, exist_ok=True)
    self._mngr = self._open()

  def _open(self):
    opts = ocp.CheckpointManagerOptions(max_to_keep=self.config.keep, save_interval_steps=1,
                                        enable_async_checkpointing=self.config.async_save,
                                        create=True, cleanup_tmp_directories=True)
    return ocp.CheckpointManager(self.directory, options=opts)

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, state: TrainState, host: dict, *, force: bool = False) -> bool:
    """Saves `state` under its step (asynchronously unless configured otherwise).

    Args:
      state: the train state; `int(state.step)` names the checkpoint.
      host: JSON-serialisable loop state (data position, counters, serialised buffer).
      force: save even if orbax's policy would skip this step (e.g. on preemption).

    Returns:
      True if a save was started.
    """
    step = int(jax.device_get(state.step))
    if step in self._mngr.all_steps():
      return False
    meta = {"format": 1, "step": step, "host": host, "saved_at": time.time()}
    if self.config.checksum:
      meta["fingerprint"] = fingerprint(state_to_dict(state))
    args = ocp.args.Composite(state=ocp.args.StandardSave(state_to_dict(state)),
                              meta=ocp.args.JsonSave(meta))
    return bool(self._mngr.save(step, args=args, force=force))

  def wait(self) -> None:
    """Blocks until background writes are committed."""
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()

  def _restore_step(self, step: int, target: TrainState) -> Restored:
    args = ocp.args.Composite(state=ocp.args.StandardRestore(state_to_dict(target)),
                              meta=ocp.args.JsonRestore())
    out = self._mngr.restore(step, args=args)
    meta = out["meta"]
    state = state_from_dict(dict(out["state"]))
    if int(meta.get("step", -1)) != step:
      raise CorruptCheckpointError(f"checkpoint {step}: metadata names step {meta.get('step')}")
    expected = meta.get("fingerprint")
    if expected is not None and fingerprint(state_to_dict(state)) != list(expected):
      raise CorruptCheckpointError(f"checkpoint {step}: state does not match its fingerprint")
    return Restored(step, state, meta.get("host", {}))

  def restore(self, target: TrainState, step: int | None = None) -> Restored | None:
    """Restores the newest readable checkpoint onto `target`'s shardings.

    Args:
      target: `TrainState` of ShapeDtypeStructs with shardings (`state.with_shardings`); its
        None fields (no reference copy / dense model) must match the saved state.
      step: a specific step (no fallback); default: latest, falling back to older ones.

    Returns:
      `Restored` or None when the directory holds no usable checkpoint.
    """
    self.wait()
    steps = [step] if step is not None else sorted(self._mngr.all_steps(), reverse=True)
    for s in steps:
      try:
        return self._restore_step(s, target)
      except Exception as e:  # pylint: disable=broad-except
        if step is not None:
          raise
        moved = self._quarantine(s)
        log.warning("checkpoint at step %d in %s is unreadable or corrupt (%s: %s); moved it "
                    "to %s and trying the previous one", s, self.directory, type(e).__name__,
                    str(e)[:300], moved)
    return None

  def _quarantine(self, step: int) -> str:
    """Renames a bad step directory aside so a later save of that step does not collide."""
    src = None
    for name in os.listdir(self.directory):
      if name.split(".")[0] == str(step) and os.path.isdir(os.path.join(self.directory, name)):
        src = os.path.join(self.directory, name)
        if name == str(step):
          break
    if src is None:
      return "(not found)"
    dst = os.path.join(self.directory, f"corrupt_{step}_{int(time.time() * 1000)}")
    os.rename(src, dst)
    self._mngr.reload()
    return dst

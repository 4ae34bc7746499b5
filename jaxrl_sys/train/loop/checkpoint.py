"""Orbax checkpoints of the train state plus the loop's host state, with corruption fallback.

One checkpoint step holds two items:
  state: the `TrainState` leaves (params, optimizer, reference copy, MoE balancing state, rng,
    step), written by `StandardSave` (asynchronously by default); with LoRA the params are the
    adapters, and the frozen base is not written (it never changes): the metadata records its
    digest (`models.lora.base_digest`) and a restore onto another base is refused;
  meta: JSON: the step, a fingerprint of every state leaf, and the loop's host state (data
    position, admission counters, the serialised rollout buffer: plain arrays + JSON).

The metadata also records the run's identity (`CheckpointConfig.identity`) and the state's
layout (leaf shapes and dtypes). Restoring takes a target of ShapeDtypeStructs carrying the
*new* shardings, so a checkpoint written on one mesh restores onto any other. The latest step is
tried first. A checkpoint of another configuration (identity or layout differ) raises
`CheckpointMismatchError` naming the differences and is left alone; only a real read failure
(orbax raises on truncated or missing files) or a fingerprint mismatch (silent corruption)
renames the step directory aside with a warning and tries the previous step.

A save that fails (a full disk, a lost mount; orbax reports it at that save, the next one or
`wait`) raises `CheckpointSaveError` once, in one line, after deleting the step's partial
`*.orbax-checkpoint-tmp` directory: the checkpoints before it stay usable, nothing half-written
is left. Orbax's own error logs of that failure are dropped (it is reported once).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import time
from typing import NamedTuple

import jax
import orbax.checkpoint as ocp

from jaxrl_sys.train.loop.compat import CheckpointMismatchError, check_compatible, state_layout
from jaxrl_sys.train.loop.config import CheckpointConfig
from jaxrl_sys.train.step.state import TrainState
from jaxrl_sys.utils.fingerprint import fingerprint

log = logging.getLogger(__name__)
_FIELDS = TrainState._fields


class Restored(NamedTuple):
  """A restored checkpoint: the step, the state (on the target's shardings), the host dict,
  and one line per newer step that could not be read and was moved aside (`skipped`)."""
  step: int
  state: TrainState
  host: dict
  skipped: tuple[str, ...] = ()


class CorruptCheckpointError(RuntimeError):
  """A checkpoint whose contents do not match the fingerprint stored beside it."""


class CheckpointsUnreadable(RuntimeError):
  """Every checkpoint of the directory failed to read; `notes` has one line per step."""

  def __init__(self, directory: str, notes: list[str]):
    super().__init__(f"no checkpoint in {directory} can be read: " + "; ".join(notes))
    self.directory, self.notes = directory, list(notes)


class CheckpointSaveError(ValueError):
  """A checkpoint could not be written; its partial files were removed (see the module
  docstring)."""


class _DropSaveFailureLogs(logging.Filter):
  """Drops orbax's error logs of a failed background save (with the exception's stack) and
  asyncio's "Event loop is closed" that follow it: `Checkpointer` reports the failure once."""

  def filter(self, record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    text = f"{record.getMessage()} {exc}"
    if "Event loop is closed" in text:
      return False
    return not (record.levelno >= logging.ERROR and "orbax" in record.pathname
                and (exc is not None or "failed" in text.lower()))


_SAVE_FILTER = _DropSaveFailureLogs()
_FILTERED = ("absl", "orbax", "asyncio", "")
_FILTER_USERS = [0]  # open Checkpointers: the filter is installed while any is open


def _filter_save_logs(on: bool) -> None:
  """Installs (first user) or removes (last user) the log filter; installs the unraisable-
  exception hook below."""
  _FILTER_USERS[0] += 1 if on else -1
  for name in _FILTERED:
    if _FILTER_USERS[0] > 0:
      logging.getLogger(name).addFilter(_SAVE_FILTER)  # once: addFilter ignores repeats
    else:
      logging.getLogger(name).removeFilter(_SAVE_FILTER)
  if on and sys.unraisablehook is not _drop_closed_loop:
    # stays installed: the callbacks of a failed save may come after the Checkpointer closed
    _PREVIOUS_HOOK[0] = sys.unraisablehook
    sys.unraisablehook = _drop_closed_loop


_PREVIOUS_HOOK = [sys.unraisablehook]


def _drop_closed_loop(unraisable) -> None:
  """tensorstore's completion callbacks of a failed orbax write reach an event loop orbax has
  closed: Python prints each as an unraisable "Event loop is closed" stack. Dropped; the rest
  goes to the previous hook."""
  if "Event loop is closed" not in str(unraisable.exc_value):
    _PREVIOUS_HOOK[0](unraisable)


class _DropClosedLoop(logging.Filter):
  """Hides asyncio's "Event loop is closed" reports that a failed orbax read leaves behind
  (one per pending read task; the failure itself is reported once, by `restore`)."""

  def filter(self, record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    text = f"{record.getMessage()} {exc}"
    return "Event loop is closed" not in text


@contextlib.contextmanager
def quiet_asyncio():
  """Within the block, asyncio's and orbax's loggers drop "Event loop is closed" noise."""
  filt = _DropClosedLoop()
  loggers = [logging.getLogger(n) for n in ("asyncio", "absl", "orbax", "")]
  for lg in loggers:
    lg.addFilter(filt)
  try:
    yield
  finally:
    for lg in loggers:
      lg.removeFilter(filt)


def state_to_dict(state: TrainState) -> dict:
  """The state as a dict without its None fields (orbax writes no empty items) and without
  the LoRA base (never checkpointed)."""
  return {k: v for k, v in state._asdict().items() if v is not None and k != "base"}


def state_from_dict(d: dict) -> TrainState:
  return TrainState(**{k: d.get(k) for k in _FIELDS})


class Checkpointer:
  """Async orbax `CheckpointManager` with keep-last-K, fingerprints and fallback on restore."""

  def __init__(self, config: CheckpointConfig):
    if config.directory is None:
      raise ValueError("Checkpointer needs CheckpointConfig.directory")
    self.config = config
    # With LoRA: the digest of the run's frozen base, recorded by `save` and compared by
    # `restore` (set by the loop once the base is known).
    self.base_digest: str | None = None
    self.directory = os.path.abspath(config.directory)
    os.makedirs(self.directory, exist_ok=True)
    self._failure: CheckpointSaveError | None = None
    self._mngr = self._open()
    _filter_save_logs(True)
    self._filtering = True

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
    meta = {"format": 1, "step": step, "host": host, "saved_at": time.time(),
            "identity": self.config.identity, "layout": state_layout(state_to_dict(state))}
    if self.base_digest is not None:
      meta["lora_base"] = self.base_digest
    if self.config.checksum:
      meta["fingerprint"] = fingerprint(state_to_dict(state))
    args = ocp.args.Composite(state=ocp.args.StandardSave(state_to_dict(state)),
                              meta=ocp.args.JsonSave(meta))
    if self._failure is not None:
      raise self._failure
    try:
      return bool(self._mngr.save(step, args=args, force=force))
    except Exception as e:  # pylint: disable=broad-except  (a failed write, this save or the last)
      raise self._save_failed(e, step) from e

  def wait(self) -> None:
    """Blocks until background writes are committed.

    Raises:
      CheckpointSaveError: a save failed (reported once; its partial files are removed).
    """
    if self._failure is not None:
      return
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(e, None) from e

  def close(self) -> None:
    """Waits for the save in flight (raising its failure, unless already raised), then closes."""
    try:
      self.wait()
    finally:
      if self._filtering:
        self._filtering = False
        _filter_save_logs(False)
      try:
        self._mngr.close()
      except Exception:  # pylint: disable=broad-except
        if self._failure is None:
          raise

  def _save_failed(self, error: Exception, step: int | None) -> CheckpointSaveError:
    """Removes the partial step directories and returns the one-line error of the failure."""
    text = str(error)
    partial = sorted(n for n in os.listdir(self.directory) if n.endswith(".orbax-checkpoint-tmp"))
    named = re.search(r"/(\d+)\.orbax-checkpoint-tmp", text)
    if named is not None:
      step = int(named.group(1))
    elif partial:
      step = int(partial[-1].split(".")[0])
    for name in partial:  # orbax's writes have ended (they failed): nothing writes here now
      shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    full = ("No space left" in text or "RESOURCE_EXHAUSTED" in text
            or getattr(error, "errno", None) == 28)
    why = ("the disk is full (No space left on device)" if full else
           f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}")
    try:
      self._mngr.reload()
      kept = self.all_steps()
    except Exception:  # pylint: disable=broad-except
      kept = []
    where = f"checkpoint {step}" if step is not None else "a checkpoint"
    self._failure = CheckpointSaveError(
        f"saving {where} in {self.directory} failed: {why}. Its partial files were removed; "
        + (f"the checkpoints of steps {kept} are intact. Free space there (or choose another "
           "--checkpoint_dir), then continue with --resume" if kept else
           "no checkpoint was written. Free space there (or choose another --checkpoint_dir), "
           "then run again"))
    return self._failure

  def _read_meta(self, step: int) -> dict:
    meta = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if not isinstance(meta, dict) or int(meta.get("step", -1)) != step:
      raise CorruptCheckpointError(f"checkpoint {step}: metadata names step "
                                   f"{meta.get('step') if isinstance(meta, dict) else meta}")
    return meta

  def _restore_step(self, step: int, target: TrainState) -> Restored:
    meta = self._read_meta(step)
    check_compatible(step, self.directory, meta, self.config.identity,
                     state_layout(state_to_dict(target)), self.base_digest)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(state_to_dict(target)))
    state = state_from_dict(dict(self._mngr.restore(step, args=args)["state"]))
    expected = meta.get("fingerprint")
    if expected is not None and fingerprint(state_to_dict(state)) != list(expected):
      raise CorruptCheckpointError(f"checkpoint {step}: state does not match its fingerprint")
    return Restored(step, state, meta.get("host", {}))

  def restore(self, target: TrainState, step: int | None = None) -> Restored | None:
    """Restores the newest readable checkpoint onto `target`'s shardings.

    Args:
      target: `TrainState` of ShapeDtypeStructs with shardings (`state.with_shardings`); its
        None fields (no reference copy / dense model) must match the saved state; its `base`
        is ignored (the restored state's is None: the caller attaches the base).
      step: a specific step (no fallback); default: latest, falling back to older ones.

    Returns:
      `Restored` (its `skipped` lists the newer steps moved aside) or None when the directory
      holds no checkpoint.

    Raises:
      CheckpointsUnreadable: there are checkpoints and none can be read (nothing is moved).
      CheckpointMismatchError: the newest readable checkpoint was written by a run with another
        configuration (`CheckpointConfig.identity`) or state layout; nothing is moved.
    """
    self.wait()
    steps = [step] if step is not None else sorted(self._mngr.all_steps(), reverse=True)
    failed: list[tuple[int, str]] = []
    for s in steps:
      try:
        with quiet_asyncio():
          got = self._restore_step(s, target)
      except CheckpointMismatchError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        if step is not None:
          raise
        why = str(e).split(". See full TensorStore details")[0]  # a bound-method repr follows
        failed.append((s, f"{type(e).__name__}: {why[:200]}"))
        log.info("checkpoint at step %d in %s is unreadable (%s); trying the previous one", s,
                    self.directory, failed[-1][1])
        continue
      # Only once an older one is known good are the unreadable newer ones moved aside.
      skipped = tuple(f"checkpoint at step {b} is unreadable or corrupt ({why}); moved it to "
                      f"{self._quarantine(b)}" for b, why in failed)
      for note in skipped:
        log.warning("%s in %s; restored step %d instead", note, self.directory, s)
      return got._replace(skipped=skipped)
    if failed:
      raise CheckpointsUnreadable(self.directory, [f"step {b}: {why}" for b, why in failed])
    return None

  def _quarantine(self, step: int) -> str:
    """Renames a bad step directory aside so a later save of that step does not collide
    (several processes: process 0 renames, the others wait for it)."""
    if jax.process_count() > 1:
      from jaxrl_sys.train.multihost import collectives as multihost  # pylint: disable=import-outside-toplevel
      moved = multihost.share_from_main(f"quarantine/{step}", lambda: self._rename_aside(step))
      multihost.sync(f"quarantine_{step}")
      self._mngr.reload()
      return moved
    moved = self._rename_aside(step)
    self._mngr.reload()
    return moved

  def _rename_aside(self, step: int) -> str:
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
    return dst

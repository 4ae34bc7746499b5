"""The RL loop's resume: restoring a checkpoint for `--resume`, and the loop's host state.

`restore` reads the newest usable checkpoint and checks it fits the run (steps, samples per
group); `host_state` is what every checkpoint saves beside the `TrainState` (data position,
admission counters, the rollout buffer with the client's in-flight token state, each resumable
hook's state) and `load_host_state` its inverse, run before the first step.
"""
from __future__ import annotations

from typing import Callable, Mapping, Protocol

from jaxrl_sys.rollout.types import RolloutSession
from jaxrl_sys.rollout.wire import request_to_json
from jaxrl_sys.train.loop.buffer import RolloutBuffer
from jaxrl_sys.train.loop.checkpoint import Checkpointer, CheckpointsUnreadable
from jaxrl_sys.train.step.state import TrainState


class UnreadableCheckpointsError(ValueError):
  """`--resume` found checkpoints, and none of them can be read."""


class Resumable(Protocol):
  """A part of the run's host state owned by a hook (e.g. the offload controller): saved with
  every checkpoint under its key, restored (None for a fresh run) before the first step."""

  def state_dict(self) -> dict: ...

  def load_state_dict(self, state: dict | None) -> None: ...


def restore(ckpt: Checkpointer, target: TrainState, *, steps: int, samples_per_group: int,
            message: Callable[[str], None]) -> tuple[TrainState, dict, int] | None:
  """Restores the newest readable checkpoint of `ckpt` onto `target` (`TrainState` of
  ShapeDtypeStructs with the run's shardings); returns `(state, host, step)` (the state's `base`
  is None: the caller attaches it), or None (said through `message`) when the directory holds
  no checkpoint. Raises `UnreadableCheckpointsError` when none of the checkpoints can be read,
  ValueError when the checkpoint stands past `steps` or has another number of samples per
  group."""
  try:
    got = ckpt.restore(target)
  except CheckpointsUnreadable as e:
    raise UnreadableCheckpointsError(
        f"nothing can be resumed: every checkpoint in {ckpt.directory} is unreadable:\n"
        + "\n".join(f"  {n}" for n in e.notes) + "\nNothing was moved or deleted. To start "
        "the run again from scratch, pass --overwrite instead of --resume (deletes the run "
        "directory's outputs, its checkpoints/ included), or give another --out_dir / "
        "--checkpoint_dir") from None
  if got is not None and got.step > steps:
    raise ValueError(
        f"--steps={steps} is below step {got.step}, where the resumed run stands "
        f"({ckpt.directory}); give --steps above {got.step} to train further")
  if got is not None:
    host = got.host
    samples = samples_per_group
    if host.get("samples_per_group") not in (None, samples):
      raise ValueError(f"checkpoint has {host['samples_per_group']} samples per group, this "
                       f"run {samples}; resume with the same --group_size / --algo")
    for note in got.skipped:
      message(f"warning: {note}")
    message(f"resumed from step {got.step} ({ckpt.directory})")
    return got.state, host, got.step
  message(f"nothing to resume: {ckpt.directory} holds no checkpoint; starting a fresh run")
  return None


def host_state(client: RolloutSession, buffer: RolloutBuffer,
               resumables: Mapping[str, Resumable], *, next_prompt: int, accepted: int,
               samples_per_group: int, seed: int) -> dict:
  """The loop's host state; the client's in-flight token state (`snapshot()`) is saved as
  partial requests, which a resumed run resubmits first; each resumable hook's under its
  key."""
  data = buffer.to_json()
  data["partials"] = data["partials"] + [request_to_json(r) for r in client.snapshot()]
  out = {"next_prompt": next_prompt, "accepted": accepted,
         "samples_per_group": samples_per_group, "seed": seed,
         "buffer": data}
  for key, part in resumables.items():
    out[key] = part.state_dict()
  return out


def load_host_state(host: dict, samples_per_group: int, resumables: Mapping[str, Resumable]
                    ) -> tuple[int, int, RolloutBuffer]:
  """`host_state`'s inverse (a fresh run's `host` holds only the counters, both 0): loads each
  resumable hook's state (None when `host` has none) and returns `(next_prompt, accepted,
  buffer)`."""
  next_prompt, accepted = int(host["next_prompt"]), int(host["accepted"])
  buffer = (RolloutBuffer.from_json(host["buffer"]) if "buffer" in host
            else RolloutBuffer(samples_per_group))
  for key, part in resumables.items():
    part.load_state_dict(host.get(key))
  return next_prompt, accepted, buffer

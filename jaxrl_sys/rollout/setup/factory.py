"""Rollout clients by name: `make_client(setup, model_config, engine_config, ...)`.

Every client a run uses is built here, once (the recipe builds the training client and the
evaluation client and hands them over). Kinds are registered as `name -> "module:function"` and
imported only when asked for (the Ray client imports Ray; the in-process ones import JAX), as
`rollout.weights.factory` does for weight stores:

  local    one `InProcessWorker` on this process's devices (`rollout.setup.local`)
  thread   several `ThreadWorker`s splitting the slots (same module)
  ray      Ray workers under a `Fleet`, with a weight store (`rollout.setup.ray`)

Each builder is `fn(setup, model_config, engine_config, *, options, clock) -> RolloutSession`
and returns a client with no weights: the caller publishes them.
"""
from __future__ import annotations

import dataclasses
import importlib

from jaxrl_sys.models import ModelConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.setup.spec import ClientOptions, RolloutSetup

CLIENTS: dict[str, str] = {
    "local": "jaxrl_sys.rollout.setup.local:local_client",
    "thread": "jaxrl_sys.rollout.setup.local:thread_client",
    "ray": "jaxrl_sys.rollout.setup.ray:ray_client",
}


def client_kind(setup: RolloutSetup, local_workers: int) -> str:
  """The registered kind `setup` builds: "ray" for Ray workers; in-process, "thread" with more
  than one local engine (`local_workers`, resolved), else "local"."""
  if setup.rollout != "local":
    return setup.rollout
  return "thread" if local_workers > 1 else "local"


def make_client(setup: RolloutSetup, model_config: ModelConfig, engine_config: EngineConfig, *,
                options: ClientOptions = ClientOptions(), clock: Clock = WALL,
                kind: str | None = None):
  """A new rollout client (a `rollout.types.RolloutSession`, no weights published yet).

  Args:
    setup: where rollout runs (the run's `rollout` section).
    model_config: the policy as the engines run it (the rollout dtype).
    engine_config: every engine's static config (slots, lengths, sampling).
    options: how the workers start (`ClientOptions`: local engine count, 0 = auto by
      `local.local_worker_count` for the engine's slots; warm-up, seed, compile cache).
    clock: the time source of the manager's timeouts and of its workers' schedules.
    kind: a name of `CLIENTS` instead of `client_kind`'s choice.

  Raises:
    ValueError: an unknown kind.
  """
  if setup.rollout == "local":  # resolved here, where the engine's slots are known
    from jaxrl_sys.rollout.setup.local import local_worker_count  # pylint: disable=import-outside-toplevel
    workers = local_worker_count(options.local_workers, engine_config.num_slots)
    options = dataclasses.replace(options, local_workers=workers)
  kind = kind or client_kind(setup, options.local_workers)
  target = CLIENTS.get(kind)
  if target is None:
    raise ValueError(f"unknown rollout client {kind!r}; known: {sorted(CLIENTS)}")
  module, name = target.split(":")
  build = getattr(importlib.import_module(module), name)
  return build(setup, model_config, engine_config, options=options, clock=clock)

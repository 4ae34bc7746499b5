"""`InProcessRollout`: the RolloutClient over one engine in the trainer's own process.

Nothing runs in the background: `poll()` drives `Engine.step()` until enough completions exist.
This is the embedded default (rollout shares the accelerator with training).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Sequence

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.engine.engine import Engine
from jaxrl_sys.rollout.types import Completion, Request, TokenChunk


class InProcessRollout:
  """Implements `rollout.types.RolloutClient` with one `Engine`.

  Example:
    client = InProcessRollout.create(model_config, params, EngineConfig(num_slots=16))
    client.submit(requests)
    while client.num_pending():
      for c in client.poll(min_count=8):
        ...
  """

  def __init__(self, engine: Engine):
    self.engine = engine

  @classmethod
  def create(cls, model_config: ModelConfig, params: Any, engine_config: EngineConfig | None = None,
             version: int = 0, on_chunk: Callable[[list[TokenChunk]], None] | None = None,
             moe_state: Any = None) -> "InProcessRollout":
    """Builds the engine and the client. `on_chunk` receives every streamed chunk list;
    `moe_state` is the policy's MoE balancing state (None: dense model, or zeros)."""
    return cls(Engine(model_config, params, engine_config or EngineConfig(), version=version,
                      on_chunk=on_chunk, moe_state=moe_state))

  def submit(self, requests: Sequence[Request]) -> None:
    """Queues requests (fresh or partial); never generates."""
    self.engine.submit(requests)

  def poll(self, min_count: int = 0, timeout: float | None = None) -> list[Completion]:
    """Returns completions finished since the last call, generating as needed.

    Steps the engine until at least `max(min_count, 1)` completions are available, no work is
    left, or `timeout` seconds have passed (checked before each step; `timeout=0` only returns
    what is already finished). Completions are returned in finishing order; there may be more
    than `min_count`.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    out = self.engine.take_completions()
    while len(out) < max(min_count, 1) and self.engine.has_work():
      if deadline is not None and time.monotonic() >= deadline:
        break
      self.engine.step()
      out.extend(self.engine.take_completions())
    return out

  def abort(self, request_ids: Iterable[int] | None = None) -> list[Request]:
    """Stops requests (all when None), returning their partial state. Completions already
    finished but not yet polled stay available to `poll()`."""
    return self.engine.abort(request_ids)

  def publish(self, params: Any, version: int, moe_state: Any = None) -> None:
    """Tokens generated from now on use `params` (and `moe_state`, an MoE policy's routing
    biases; None = zeros) and carry `version`."""
    self.engine.load(params, version, moe_state)

  def num_pending(self) -> int:
    """Requests submitted and not yet returned by `poll()` or `abort()`."""
    e = self.engine
    return e.num_running + e.num_waiting + e.num_unread_completions

  def snapshot(self) -> list[Request]:
    """Copies of the unfinished requests' token state (id order), nothing stopped."""
    e = self.engine
    reqs = e.running_requests() + [dataclasses.replace(r) for r in e._waiting]  # pylint: disable=protected-access
    return sorted(reqs, key=lambda r: r.request_id)

  @property
  def stats(self):
    return self.engine.stats

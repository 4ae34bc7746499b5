"""Lossless speculative tool calls, and the tool runner an episode's env calls through.

While the policy writes a turn, a predictor guesses the calls it will make; calls of read-only
tools among them start at once in the `ToolExecutor`. When the env runs the turn's calls, a call
whose identity (`ToolCall.key`: name and arguments) equals a prefetched one takes that result
(waiting for it if it is still running); any other call runs as usual. A read-only tool's result
depends only on its arguments, so the observation, and therefore the episode, is the same as
without prefetch: only earlier. Predicted calls the policy does not make are wasted work
(`prefetch_misses`), bounded by `AgentConfig.prefetch_max` calls in flight.

Predictors (pluggable: anything with `predict(episode_view) -> list[ToolCall]`):
- `StreamPredictor(parser)` (the default): the calls already closed in the partially streamed
  text of the turn (`parser.complete_calls`): the call starts as soon as its closing marker is
  sampled, while the policy still writes the rest of its turn;
- the env's own `predict_calls(observations, partial_text)` when it has one (e.g. the search
  task predicts the question's entity before the turn starts).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Any, Mapping, Sequence

from jaxrl_sys.tasks.tools.base import Tool, ToolCall, ToolResult
from jaxrl_sys.tasks.tools.executor import ToolExecutor


@dataclasses.dataclass
class PrefetchStats:
  """Counters: `started` speculative calls, `hits` (used by the sampled call), `misses`
  (never used), `seconds_saved` (tool time that overlapped the policy's generation)."""
  started: int = 0
  hits: int = 0
  misses: int = 0
  seconds_saved: float = 0.0

  def as_dict(self) -> dict[str, float]:
    return {"prefetch_started": float(self.started), "prefetch_hits": float(self.hits),
            "prefetch_misses": float(self.misses),
            "prefetch_seconds_saved": float(self.seconds_saved)}


class StreamPredictor:
  """Predicts the calls already closed in the streamed text of a turn."""

  def __init__(self, parser):
    self.parser = parser

  def predict(self, observations: list[list[str]], partial: str) -> list[ToolCall]:
    del observations
    return self.parser.complete_calls(partial)


class Prefetcher:
  """Speculative calls of every episode (thread-safe: envs look up results from their own
  threads while the driver starts calls)."""

  def __init__(self, executor: ToolExecutor, max_in_flight: int = 64):
    self.executor, self.max_in_flight = executor, max_in_flight
    self.stats = PrefetchStats()
    self._lock = threading.Lock()
    self._calls: dict[int, dict[str, tuple[cf.Future, float]]] = {}  # episode -> key -> (fut, t0)

  def in_flight(self) -> int:
    return sum(1 for calls in self._calls.values() for f, _ in calls.values() if not f.done())

  def start(self, episode_id: int, tools: Mapping[str, Tool], calls: Sequence[ToolCall]) -> int:
    """Starts the predicted `calls` of read-only tools not started yet; returns how many."""
    n = 0
    with self._lock:
      mine = self._calls.setdefault(episode_id, {})
      for c in calls:
        tool = tools.get(c.name)
        if tool is None or not tool.read_only or c.key in mine:
          continue
        if self.in_flight() >= self.max_in_flight:
          break
        mine[c.key] = (self.executor.submit(tool, c), time.monotonic())
        self.stats.started += 1
        n += 1
    return n

  def has(self, episode_id: int, call: ToolCall) -> bool:
    """Whether `call` was started speculatively for this episode."""
    with self._lock:
      return call.key in self._calls.get(episode_id, {})

  def take(self, episode_id: int, call: ToolCall) -> ToolResult | None:
    """The prefetched result of `call` (waiting for it), or None when it was not predicted."""
    with self._lock:
      got = self._calls.get(episode_id, {}).pop(call.key, None)
    if got is None:
      return None
    fut, t0 = got
    asked = time.monotonic()
    res = fut.result()
    with self._lock:
      self.stats.hits += 1
      # The part of the call that ran before the env asked for it: time the episode saved.
      self.stats.seconds_saved += max(min(asked - t0, res.seconds), 0.0)
    return dataclasses.replace(res, prefetched=True)

  def forget(self, episode_id: int) -> None:
    """Drops an episode's unused speculative calls (at the end of each of its turns)."""
    with self._lock:
      left = self._calls.pop(episode_id, {})
      self.stats.misses += len(left)


class EpisodeRunner:
  """The `ToolRunner` bound to one episode's env: prefetched results first, the executor for
  the rest (all of a turn's calls run at the same time)."""

  def __init__(self, executor: ToolExecutor, prefetcher: Prefetcher | None, episode_id: int):
    self.executor, self.prefetcher, self.episode_id = executor, prefetcher, episode_id

  def run(self, tools: Mapping[str, Tool], calls: Sequence[ToolCall]) -> list[ToolResult]:
    slots: list[Any] = []
    for c in calls:
      got = None
      tool = tools.get(c.name)
      if (self.prefetcher is not None and tool is not None and tool.read_only
          and self.prefetcher.has(self.episode_id, c)):
        got = c
      slots.append(got if got is not None else self.executor.submit(tool, c))
    out = []
    for s in slots:
      out.append(self.prefetcher.take(self.episode_id, s) if isinstance(s, ToolCall)
                 else s.result())
    return out

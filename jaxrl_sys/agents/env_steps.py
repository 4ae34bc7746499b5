"""The env side of `EpisodeDriver`: env resets and steps run off the driver's thread.

Every env call (`reset` or a resume's restore / replay, and each `step`) runs on the driver's
env thread pool (`AgentConfig.env_workers` threads); an env whose `step` is a coroutine runs it
on one shared asyncio event loop on a thread of its own. The driver's thread never blocks on an
env: `_collect_env` takes the finished calls and hands their results to the episode
(`_begin`, `_after_step`, or the resumed turn), and `_gather_quick` lets a burst of quick env
steps start their next turns in the same engine step.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import threading
import time
from typing import Any, Callable

from jaxrl_sys.agents.episode import Episode
from jaxrl_sys.tasks.env import Action, EnvStep

# Before the engines' next step, env steps that keep finishing within QUICK_S of each other are
# waited for (QUICK_CAP_S at most): their next turns join that step (`_gather_quick`).
QUICK_S, QUICK_CAP_S = 0.001, 0.005


class EnvSteps:
  """The env-step part of `agents.driver.EpisodeDriver` (a base class of it, no state of its
  own to build: the driver's `__init__` sets it up and its `close` ends it).

  Uses the driver's `episodes`, `task` and `config`, and its episode transitions `_begin`,
  `_after_step`, `_submit_turn`, `_env_failed` and `_release_barrier`.
  """

  _env: dict[int, tuple[cf.Future, str]]    # episode id -> (future, kind) of its env call
  _pool: cf.ThreadPoolExecutor              # the env threads
  _aloop: asyncio.AbstractEventLoop | None  # async envs' event loop (started on first use)

  def _gather_quick(self, futures: list[cf.Future]) -> None:
    """Waits while the env steps `futures` keep finishing (each `QUICK_S` seconds bring one
    more; `QUICK_CAP_S` in all): a burst of quick steps (instant tools, or tools started together)
    then starts its next turns in the same engine step instead of trickling in a step apart.
    A slow step costs the wait of one empty window."""
    pending = [f for f in futures if not f.done()]
    end = time.monotonic() + QUICK_CAP_S
    while pending:
      left = end - time.monotonic()
      if left <= 0:
        return
      done, rest = cf.wait(pending, timeout=min(QUICK_S, left))
      if not done:
        return
      pending = list(rest)

  def _run_env(self, ep: Episode, kind: str, fn: Callable[[], Any]) -> None:
    ep.phase = "env"
    self._env[ep.episode_id] = (self._pool.submit(fn), kind)

  def _call_step(self, env: Any, action: Action) -> EnvStep:
    step = env.step
    if inspect.iscoroutinefunction(step):
      return asyncio.run_coroutine_threadsafe(step(action), self._async_loop()).result()
    return step(action)

  def _async_loop(self) -> asyncio.AbstractEventLoop:
    if self._aloop is None:
      self._aloop = asyncio.new_event_loop()
      threading.Thread(target=self._aloop.run_forever, name="env-async", daemon=True).start()
    return self._aloop

  def _problem(self, ep: Episode):
    meta = ep.request.meta
    return self.task.problem(int(meta.get("problem", meta.get("group", ep.request.group_id))))

  def _start(self, ep: Episode) -> Any:
    """The env's part of starting or resuming an episode (on an env thread)."""
    problem, env = self._problem(ep), ep.env
    resumed = bool(ep.actions) or ep.turn > 0 or len(ep.tokens)
    if not resumed:
      return ("fresh", env.reset(problem))
    if hasattr(env, "restore") and ep.env_snapshot is not None:
      env.restore(problem, ep.env_snapshot)
    else:  # rebuilt: reset, then the recorded actions again (their tools are called again)
      env.reset(problem)
      for i, text in enumerate(ep.actions[:len(ep.observations)]):
        self._call_step(env, Action(text, turn=i))
    if len(ep.actions) > len(ep.observations):  # the step in flight at the checkpoint
      return ("step", self._step_now(ep, Action(ep.actions[-1], turn=len(ep.actions) - 1)))
    return ("resumed", None)

  def _step_now(self, ep: Episode, action: Action) -> EnvStep:
    """An env step on an env thread; `ep.env_snapshot` still holds the state before it (what a
    checkpoint taken meanwhile resumes from, running the step again)."""
    return self._call_step(ep.env, action)

  def _collect_env(self) -> None:
    for eid, (fut, kind) in list(self._env.items()):
      if not fut.done():
        continue
      del self._env[eid]
      ep = self.episodes[eid]
      try:
        got = fut.result()
      except Exception as e:  # pylint: disable=broad-except
        self._env_failed(ep, kind, e)
        continue
      if kind == "reset":
        how, value = got
        if how == "fresh":
          self._begin(ep, value)
        elif how == "step":
          self._after_step(ep, value)
        else:
          self._submit_turn(ep, resume=True)
      else:
        self._after_step(ep, got)
    if self.config.turn_barrier:
      self._release_barrier()

  def _snapshot_env(self, ep: Episode) -> None:
    """Records the env's state between steps (its thread is idle)."""
    if hasattr(ep.env, "snapshot"):
      ep.env_snapshot = ep.env.snapshot()

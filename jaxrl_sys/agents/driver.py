"""`EpisodeDriver`: multi-turn episodes over a rollout session, each advancing on its own.

The driver is a rollout client towards the training loop (`submit` the loop's requests, one per
episode; `poll` finished episodes; `abort`; `snapshot`; `publish`) and a client of a rollout
session towards the engines (the `RolloutManager` over in-process, thread or Ray workers, or
its default embedded form). An episode alternates:

  generate turn t   the turn's request (prompt = episode prompt + every token so far) is
                    submitted; the engines stream its tokens;
  env step          when the turn ends, the template glue closes it, the env's `step` runs on a
                    thread (its tools in the bounded `ToolExecutor`), and its observation ids
                    open turn t + 1, which is submitted at once.

There is no turn barrier: while one episode's tools run, every other episode keeps decoding
(`AgentConfig.turn_barrier=True` restores the batch-synchronous way, for comparison). Each turn
carries the episode as its session (`meta["session"]`): the manager sends it to the worker that
served the previous turn, whose engine reuses the KV of the shared prefix; any other worker
re-prefills it. A worker lost mid-turn is the manager's usual token-level migration; lost
between turns, nothing is lost at all (the episode lives here). Everything the trainer needs to
resume an episode exactly is in `abort()` / `snapshot()`'s requests (`agents.episode`).

The sequence an episode trains on is the sampled ids, the glue and the observation ids, in
order, never re-tokenized (`tasks.turns`); the mask is `versions >= 0`.

This module holds the client protocol and the episode's transitions (turns, the outcome of an
env step, the turn barrier, speculation); running the env calls themselves, on threads, is
`agents.env_steps.EnvSteps`, a base class of the driver.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import logging
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from jaxrl_sys.agents.config import AgentConfig
from jaxrl_sys.agents.env_steps import EnvSteps
from jaxrl_sys.agents.episode import Episode
from jaxrl_sys.agents.prefetch import EpisodeRunner, Prefetcher, StreamPredictor
from jaxrl_sys.rollout.types import Completion, FinishReason, Request
from jaxrl_sys.tasks.env import Action, EnvStep
from jaxrl_sys.tasks.tools.executor import ToolExecutor

log = logging.getLogger(__name__)

# The statuses of a tool call (`ToolResult.status`), each counted as metric `agent_tool_<status>`.
TOOL_STATUSES = ("ok", "malformed", "unclosed", "unknown", "error", "timeout", "killed")


class EpisodeDriver(EnvSteps):
  """Runs episodes over `session` (see the module docstring).

  Args:
    session: the rollout client the turns go to (`submit`, `poll`, `abort`, `snapshot`,
      `publish`, `num_pending`; `metrics`, `describe`, `close`, `add_tick_hook` when it has them).
    env_factory: a zero-argument callable returning a fresh env per episode.
    task: gives each episode's problem: `task.problem(request.meta["problem"])`.
    turn_format: the tokenizer's `tasks.turns.TurnFormat`.
    config: `AgentConfig`.
    executor: the tool executor (default: one from the config's tool settings).
    close_session: `close()` closes `session` too (the driver owns it).
  """

  def __init__(self, session: Any, env_factory: Callable[[], Any], task: Any, turn_format: Any,
               config: AgentConfig = AgentConfig(), executor: ToolExecutor | None = None,
               close_session: bool = False):
    self.session, self.env_factory, self.task, self.fmt = session, env_factory, task, turn_format
    self.config, self.close_session = config, close_session
    self._own_executor = executor is None
    self.executor = executor or ToolExecutor(config.tool_workers, config.tool_timeout,
                                             config.tool_output_chars)
    self.prefetcher = Prefetcher(self.executor, config.prefetch_max) if config.prefetch else None
    if config.check_template and hasattr(turn_format, "check"):
      turn_format.check()
    self.episodes: dict[int, Episode] = {}
    self._by_turn: dict[int, int] = {}   # turn request id -> episode id (generating)
    self._env: dict[int, tuple[cf.Future, str]] = {}   # episode id -> (future, kind)
    self._pool = cf.ThreadPoolExecutor(config.env_workers, thread_name_prefix="env")
    self._aloop: asyncio.AbstractEventLoop | None = None
    self._done: list[Completion] = []
    self._seen_partial: dict[int, int] = {}
    self._held_actions: dict[int, Action] = {}  # turn barrier: actions waiting for the round
    self.counts: collections.Counter[str] = collections.Counter()
    self.first_env_error: str | None = None

  # ----- the client protocol ---------------------------------------------------------------------
  def submit(self, requests: Sequence[Request]) -> None:
    """Starts (or resumes, for requests returned by `abort` / `snapshot`) one episode per
    request; the request's id is the episode's."""
    for r in requests:
      if r.request_id in self.episodes:
        raise ValueError(f"episode {r.request_id} is already in flight in the episode driver")
      ep = Episode.from_request(r)
      ep.env = self.env_factory()
      if hasattr(ep.env, "bind"):
        ep.env.bind(EpisodeRunner(self.executor, self.prefetcher, ep.episode_id))
      self.episodes[ep.episode_id] = ep
      self.counts["agent_episodes_started"] += int("episode_state" not in r.meta)
      self._run_env(ep, "reset", lambda ep=ep: self._start(ep))

  def poll(self, min_count: int = 0, timeout: float | None = None) -> list[Completion]:
    """Finished episodes since the last call, driving generation and env steps until at least
    `max(min_count, 1)` exist, no episode is left, or `timeout` seconds pass (`timeout=0`:
    what is finished already)."""
    want = max(min_count, 1)
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(self._done) < want and self.episodes:
      self._collect_env()
      if len(self._done) >= want:
        break
      now = time.monotonic()
      if deadline is not None and now >= deadline:
        break
      left = 0.05 if deadline is None else min(deadline - now, 0.05)
      if self._by_turn:
        if self.prefetcher is not None:
          self._speculate()
        wait = 0.002 if self._env else (0.01 if self.prefetcher is not None else left)
        started = [self._on_turn(c) for c in self.session.poll(min_count=1,
                                                               timeout=min(wait, left))]
        if any(started):  # quick env steps' next turns join the engines' very next step
          self._gather_quick([self._env[e][0] for e in started if e in self._env])
      elif self._env:
        done, _ = cf.wait([f for f, _ in self._env.values()], timeout=left,
                          return_when=cf.FIRST_COMPLETED)
        if done:  # the others of a burst of env steps start their turns with these
          self._gather_quick([f for f, _ in self._env.values()])
    out, self._done = self._done, []
    return out

  def abort(self, request_ids: Iterable[int] | None = None) -> list[Request]:
    """Stops episodes (all when None) and returns each one's exact state as a request that
    `submit` resumes. An env step in flight is waited for (tools are bounded by their timeout)
    so that no observation is lost."""
    want = list(self.episodes) if request_ids is None else [
        int(i) for i in request_ids if int(i) in self.episodes]
    for eid in want:
      if eid in self._env:
        try:
          self._env[eid][0].result()
        except Exception:  # pylint: disable=broad-except
          pass
    self._collect_env()
    turns = [self.episodes[e].turn_id for e in want if e in self.episodes
             and self.episodes[e].turn_id in self._by_turn]
    partial = {r.request_id: r for r in (self.session.abort(turns) if turns else [])}
    out = []
    for eid in want:
      ep = self.episodes.get(eid)
      if ep is None:
        continue
      if ep.turn_id in self._by_turn:
        self._by_turn.pop(ep.turn_id)
        self._fold_partial(ep, partial.get(ep.turn_id))
      out.append(ep.state_request())
      self._forget(ep)
    self.counts["agent_episodes_aborted"] += len(out)
    return sorted(out, key=lambda r: r.request_id)

  def snapshot(self) -> list[Request]:
    """Copies of every unfinished episode's state (what a checkpoint saves), nothing stopped;
    an episode whose env step is in flight resumes by running that step again."""
    partial = {r.request_id: r for r in self.session.snapshot()}
    out = []
    for ep in self.episodes.values():
      copy = Episode(ep.request, ep.tokens, ep.logprobs, ep.versions, ep.turn, ep.turn_start,
                     ep.phase, list(ep.rewards), list(ep.actions),
                     [list(o) for o in ep.observations], ep.env_snapshot, None, dict(ep.info),
                     routes=ep.routes)
      if ep.turn_id in self._by_turn:
        self._fold_partial(copy, partial.get(ep.turn_id))
      out.append(copy.state_request())
    return sorted(out, key=lambda r: r.request_id)

  def publish(self, params: Any, version: int, moe_state: Any = None, base: Any = None) -> None:
    if base is None:
      self.session.publish(params, version, moe_state)
    else:  # LoRA: adapters naming their base (`rollout.weights.BaseWeights`)
      self.session.publish(params, version, moe_state, base=base)

  def num_pending(self) -> int:
    """Episodes submitted and not yet returned by `poll` or `abort`."""
    return len(self.episodes) + len(self._done)

  def metrics(self) -> dict:
    """The session's metrics plus the agent counters (`agent_*`, cumulative)."""
    fn = getattr(self.session, "metrics", None)
    out = dict(fn()) if callable(fn) else {}
    out.update({k: float(v) for k, v in self.counts.items()})
    if self.prefetcher is not None:
      out.update({f"agent_{k}": v for k, v in self.prefetcher.stats.as_dict().items()})
    return out

  def describe(self) -> str:
    phases = collections.Counter(ep.phase for ep in self.episodes.values())
    inner = getattr(self.session, "describe", lambda: "")()
    return f"{len(self.episodes)} episodes in flight {dict(phases)}; {inner}"

  def add_tick_hook(self, hook) -> None:
    self.session.add_tick_hook(hook)

  def close(self) -> None:
    """Ends the env threads and the executor (and the session with `close_session`)."""
    self._pool.shutdown(wait=False, cancel_futures=True)
    if self.close_session:
      self.session.close()
    if self._own_executor:
      self.executor.close()
    if self._aloop is not None:
      self._aloop.call_soon_threadsafe(self._aloop.stop)

  def __getattr__(self, name: str):
    if name in ("session",):  # not set yet
      raise AttributeError(name)
    return getattr(self.session, name)  # worker_times, loads, ... of the session

  # ----- an env step's outcome -------------------------------------------------------------------
  def _env_failed(self, ep: Episode, kind: str, e: Exception) -> None:
    msg = f"{type(e).__name__}: {e}"
    ep.info["env_error"] = msg
    self.counts["agent_env_errors"] += 1
    if self.first_env_error is None:
      self.first_env_error = msg
      log.warning("env %s raised for episode %d (the episode ends, reward %s, left out of the "
                  "gradient; further errors are counted in agent_env_errors): %s",
                  kind, ep.episode_id, sum(ep.rewards), msg)
    self._finish(ep, FinishReason.STOP)

  def _begin(self, ep: Episode, first: Any) -> None:
    """A fresh episode's first turn (the prompt re-encoded when the env's first observation is
    not the problem's prompt)."""
    self._snapshot_env(ep)
    if isinstance(first, str) and first != self._problem(ep).prompt:
      ep.request.prompt = np.asarray(self.fmt.prompt(first), np.int32)
    self._submit_turn(ep)

  def _after_step(self, ep: Episode, step: EnvStep) -> None:
    if not isinstance(step, EnvStep):
      self._env_failed(ep, "step", TypeError(f"step returned {type(step).__name__}, not EnvStep"))
      return
    if self.prefetcher is not None:
      self.prefetcher.forget(ep.episode_id)
    self._snapshot_env(ep)  # the state after the step: what a resumed episode restores
    ep.rewards.append(float(step.reward))
    for res in step.info.get("tool_results", ()):
      self.counts["agent_tool_calls"] += 1
      self.counts[f"agent_tool_{res.status}"] += 1
      self.counts["agent_tool_truncated"] += int(res.truncated)
      self.counts["agent_tool_bad_utf8"] += int(res.bad_utf8)
    if step.done:
      ep.info["success"] = bool(step.info.get("success", sum(ep.rewards) > 0))
      self._finish(ep, FinishReason.STOP)
      return
    texts = step.texts()
    ep.observations.append(texts)
    ids = self.fmt.observation(texts)
    if len(ids) > ep.budget_left:
      self._truncate(ep, ids)
      return
    ep.append(ids)
    if ep.turn >= self.config.max_turns:
      ep.info["max_turns"] = True
      self.counts["agent_episodes_max_turns"] += 1
      self._finish(ep, FinishReason.LENGTH)
      return
    ep.turn_start = len(ep.tokens)
    self._submit_turn(ep)

  def _truncate(self, ep: Episode, ids: Sequence[int]) -> None:
    """The token budget ran out: keep what fits, end the episode, out of the gradient."""
    ep.append(list(ids)[:max(ep.budget_left, 0)])
    ep.info["truncated"] = True
    self.counts["agent_episodes_truncated"] += 1
    self._finish(ep, FinishReason.LENGTH)

  # ----- turns -----------------------------------------------------------------------------------
  def _submit_turn(self, ep: Episode, resume: bool = False) -> None:
    if self.config.turn_barrier and ep.phase == "env":
      ep.phase = "ready"  # submitted with the others of its round (`_release_barrier`)
      return
    if ep.budget_left <= 0 and not (resume and len(ep.tokens) > ep.turn_start):
      self._truncate(ep, [])
      return
    req = ep.turn_request(self.config.max_turn_tokens)
    ep.phase = "generate"
    self._by_turn[req.request_id] = ep.episode_id
    self._seen_partial[ep.episode_id] = -1
    self.session.submit([req])
    self.counts["agent_turns"] += int(not resume)
    predict = getattr(ep.env, "predict_calls", None)
    if self.prefetcher is not None and callable(predict) and hasattr(ep.env, "by_name"):
      try:
        calls = predict(list(ep.observations), "")
      except Exception:  # pylint: disable=broad-except  (a guess, never a failure)
        calls = []
      self.prefetcher.start(ep.episode_id, ep.env.by_name, calls)

  def _fold_partial(self, ep: Episode, partial: Request | None) -> None:
    """Puts the current turn's sampled tokens (from the session) into the episode."""
    n = ep.turn_start
    ep.tokens, ep.logprobs, ep.versions = ep.tokens[:n], ep.logprobs[:n], ep.versions[:n]
    ep.routes = ep.routes_for(len(ep.request.prompt) + n - 1)
    if partial is not None and partial.num_generated:
      ep.append(partial.tokens, partial.logprobs, partial.versions)
    ep.take_routes(partial)  # MoE: the turn's routes extend the episode's

  def _on_turn(self, c: Completion) -> int | None:
    """A turn finished: close it, then step its env (the episode id when a step started)."""
    eid = self._by_turn.pop(c.request_id, None)
    if eid is None:
      return None
    ep = self.episodes[eid]
    self._fold_partial(ep, c.request)
    sampled = ep.tokens[ep.turn_start:]
    glue = self.fmt.close_turn(sampled)
    action = Action(self.fmt.action_text(sampled), sampled.copy(), ep.turn,
                    c.finish == FinishReason.STOP)
    ep.turn += 1
    ep.actions.append(action.text)
    if len(glue) > ep.budget_left:
      self._truncate(ep, glue)
      return None
    ep.append(glue)
    if self.config.turn_barrier:
      ep.phase = "wait"
      self._held_actions[eid] = action
      self._release_barrier()
      return None
    self._run_env(ep, "step", lambda ep=ep, a=action: self._step_now(ep, a))
    return eid

  def _release_barrier(self) -> None:
    """Turn barrier: once no episode generates and no env step runs, the episodes waiting with
    an action step their envs together; once those are all done, the ready turns are submitted
    together."""
    if self._by_turn or self._env:
      return
    waiting = [ep for ep in self.episodes.values() if ep.phase == "wait"]
    for ep in waiting:
      action = self._held_actions.pop(ep.episode_id)
      self._run_env(ep, "step", lambda ep=ep, a=action: self._step_now(ep, a))
    if not waiting:
      for ep in list(self.episodes.values()):
        if ep.phase == "ready":
          self._submit_turn(ep)

  def _speculate(self) -> None:
    """Starts the calls already closed in the streamed tokens of the generating turns."""
    live = {eid for eid in self._by_turn.values()
            if getattr(self.episodes[eid].env, "by_name", None)}
    if not live:
      return
    for r in self.session.snapshot():
      eid = self._by_turn.get(r.request_id)
      if eid not in live or r.num_generated <= self._seen_partial.get(eid, -1):
        continue
      self._seen_partial[eid] = r.num_generated
      ep = self.episodes[eid]
      parser = getattr(ep.env, "parser", None)
      if parser is None:
        continue
      text = self.fmt.action_text(r.tokens)  # every token of the turn (a resumed one too)
      calls = StreamPredictor(parser).predict(ep.observations, text)
      if calls:
        self.prefetcher.start(eid, ep.env.by_name, calls)

  def _finish(self, ep: Episode, reason: FinishReason) -> None:
    ep.phase, ep.finish = "done", reason
    self._held_actions.pop(ep.episode_id, None)
    self.counts["agent_episodes_done"] += 1
    self.counts["agent_episode_turns"] += ep.turn
    self.counts["agent_episode_success"] += int(bool(ep.info.get("success")))
    self._done.append(Completion(ep.completion_request(), reason))
    self._forget(ep)
    if self.config.turn_barrier:
      self._release_barrier()

  def _forget(self, ep: Episode) -> None:
    self.episodes.pop(ep.episode_id, None)
    self._seen_partial.pop(ep.episode_id, None)
    if self.prefetcher is not None:
      self.prefetcher.forget(ep.episode_id)

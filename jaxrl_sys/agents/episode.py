"""`Episode`: one multi-turn episode's token-level state, and how it crosses the loop boundary.

An episode is the token sequence after its prompt: each turn's sampled ids (their log-probs and
the weight version that sampled each), then the template glue that closes the turn and the
observation ids the environment added (log-prob 0, version -1). The loss mask is exactly
`versions >= 0`: 1 on sampled tokens, 0 on observations and glue. Nothing is re-tokenized.

Towards the training loop an episode is a `Request` whose id is the episode's (the loop's
request id) and whose tokens are all of the above: finished, inside a `Completion` with
`meta["episode"]` (its reward, turns, success, whether it trains); unfinished (an abort or a
checkpoint's `snapshot`), with `meta["episode_state"]` (turn boundaries, actions, observations,
per-turn rewards, the env's snapshot), which the driver resumes exactly when it is submitted
again. Turn t runs as its own engine request: id `turn_request_id(e, t)`, key
`turn_key(key, t)` (turn 0 keeps the episode's id and key, so a one-turn episode is the
single-turn request itself), prompt = episode prompt + tokens before the turn.

MoE policies: the episode also carries the routes of every position fed so far (`routes`,
`Request.routes` of the prompt + tokens, a prefix of them: the observation tokens after the
last turn were never fed). Each turn's request takes them, so the engine forces the experts
that produced the earlier turns' log-probs and routes only the new positions (the previous
turn's last sampled token, the glue, the observation) live, whether it extends a held KV or
re-prefills; its completion's routes then cover the turn. The trainer replays them (R3).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrl_sys.rollout.types import FinishReason, Request

# Turn t >= 1 of episode e runs as request TURN_ID_BASE + e * MAX_TURNS_ID + t.
TURN_ID_BASE = 1 << 40
MAX_TURNS_ID = 1 << 10


def turn_request_id(episode_id: int, turn: int) -> int:
  """The engine request id of turn `turn` of episode `episode_id` (turn 0: the episode's)."""
  if turn == 0:
    return int(episode_id)
  if turn >= MAX_TURNS_ID:
    raise ValueError(f"turn {turn} exceeds {MAX_TURNS_ID - 1} turns per episode")
  return TURN_ID_BASE + int(episode_id) * MAX_TURNS_ID + int(turn)


def _mix32(x: np.ndarray) -> np.ndarray:
  """A 32-bit integer hash (lowbias32: a bijection with good avalanche)."""
  x = np.asarray(x, np.uint32).copy()
  with np.errstate(over="ignore"):
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
  return x


def turn_key(key: np.ndarray, turn: int) -> np.ndarray:
  """The raw PRNG key `[2]` uint32 of turn `turn` of an episode with key `key` (turn 0: the
  episode's own); deterministic, distinct per turn, computed with numpy only."""
  key = np.asarray(key, np.uint32).reshape(2)
  if turn == 0:
    return key.copy()
  t = np.uint32(turn)
  with np.errstate(over="ignore"):
    return _mix32(np.array([key[0] ^ (t * np.uint32(0x9E3779B9)), key[1] + t], np.uint32))


@dataclasses.dataclass
class Episode:
  """One episode in the driver (see the module docstring).

  Attributes:
    request: the loop's request (id, prompt, key, group, min_version, meta; `max_new_tokens`
      is the episode's token budget after the prompt).
    tokens, logprobs, versions: `[n]` the sequence after the prompt so far.
    turn: policy turns completed (the one generating is `turn`).
    turn_start: index in `tokens` where the current turn's sampled tokens begin.
    phase: "generate" (a turn is with the engines), "env" (an env step runs), "wait" (turn
      barrier: waiting for the other episodes), "done".
    rewards: per-step rewards so far (the episode reward is their sum).
    actions, observations: each turn's action text and observation texts (replay, metrics).
    env_snapshot: the env's `snapshot()` taken before the step in flight (resumption).
    finish: why it ended (STOP: the env said done; LENGTH: token budget or max_turns).
    info: outcome (`success`, `truncated`, `max_turns`, `env_error`, tool status counts).
    routes: MoE policies: `[m, layers, k]` the experts of the first m fed positions of prompt +
      tokens (see the module docstring), or None.
  """
  request: Request
  tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  logprobs: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.float32))
  versions: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  turn: int = 0
  turn_start: int = 0
  phase: str = "generate"
  rewards: list[float] = dataclasses.field(default_factory=list)
  actions: list[str] = dataclasses.field(default_factory=list)
  observations: list[list[str]] = dataclasses.field(default_factory=list)
  env_snapshot: Any = None
  finish: FinishReason | None = None
  info: dict = dataclasses.field(default_factory=dict)
  env: Any = None
  routes: np.ndarray | None = None

  @property
  def episode_id(self) -> int:
    return self.request.request_id

  @property
  def budget_left(self) -> int:
    return int(self.request.max_new_tokens - len(self.tokens))

  @property
  def turn_id(self) -> int:
    return turn_request_id(self.episode_id, self.turn)

  def append(self, tokens, logprobs=None, version: int = -1) -> None:
    """Appends ids; sampled ones with their log-probs and version, observations and glue with
    log-prob 0 and version -1."""
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    lp = (np.zeros(len(tokens), np.float32) if logprobs is None
          else np.asarray(logprobs, np.float32).reshape(-1))
    vs = np.full(len(tokens), version, np.int32) if np.ndim(version) == 0 else np.asarray(
        version, np.int32).reshape(-1)
    self.tokens = np.concatenate([self.tokens, tokens])
    self.logprobs = np.concatenate([self.logprobs, lp])
    self.versions = np.concatenate([self.versions, vs])

  def take_routes(self, r: Request | None) -> None:
    """Keeps `r`'s routes (a turn's request: they extend the episode's) when it records more
    positions than the episode so far."""
    if r is not None and r.num_routed > (0 if self.routes is None else len(self.routes)):
      self.routes = r.routes

  def routes_for(self, fed: int) -> np.ndarray | None:
    """The recorded routes of the first `fed` fed positions at most (None when none)."""
    if self.routes is None or not len(self.routes):
      return None
    return self.routes[:max(fed, 0)]

  def turn_request(self, max_turn_tokens: int | None, partial: Request | None = None) -> Request:
    """The engine request of the current turn: prompt = episode prompt + tokens before the
    turn; resumed from `partial`'s tokens when given (or the sampled tokens already held); with
    the episode's routes of the positions fed so far (MoE)."""
    r = self.request
    context = np.concatenate([r.prompt, self.tokens[:self.turn_start]])
    budget = self.request.max_new_tokens - self.turn_start
    limit = budget if max_turn_tokens is None else min(max_turn_tokens, budget)
    held = slice(self.turn_start, None)
    return Request(self.turn_id, context, int(limit), turn_key(r.key, self.turn),
                   group_id=r.group_id, tokens=self.tokens[held], logprobs=self.logprobs[held],
                   versions=self.versions[held], min_version=r.min_version,
                   meta={"session": self.episode_id, "episode": self.episode_id,
                         "turn": self.turn},
                   routes=self.routes_for(len(r.prompt) + len(self.tokens) - 1))

  def summary(self) -> dict:
    """`meta["episode"]` of the finished episode's completion (JSON)."""
    weight = 0.0 if self.info.get("truncated") or self.info.get("env_error") else 1.0
    return {"reward": float(sum(self.rewards)), "turns": self.turn,
            "success": bool(self.info.get("success", False)), "weight": weight,
            **{k: v for k, v in self.info.items() if k != "success"}}

  def completion_request(self) -> Request:
    """The finished episode as the loop's request (its id, prompt and key; every token)."""
    r = self.request
    return Request(r.request_id, r.prompt, r.max_new_tokens, r.key, group_id=r.group_id,
                   tokens=self.tokens, logprobs=self.logprobs, versions=self.versions,
                   min_version=r.min_version, meta=dict(r.meta, episode=self.summary()),
                   routes=self.routes_for(len(r.prompt) + len(self.tokens) - 1))

  def state_request(self) -> Request:
    """The unfinished episode as a resubmittable request (`meta["episode_state"]`)."""
    r = self.request
    state = {"turn": self.turn, "turn_start": self.turn_start,
             "phase": "env" if self.phase in ("env", "wait") and len(self.actions) > len(
                 self.observations) else "generate",
             "rewards": list(self.rewards), "actions": list(self.actions),
             "observations": [list(o) for o in self.observations],
             "env_snapshot": self.env_snapshot, "info": dict(self.info)}
    meta = {k: v for k, v in r.meta.items() if k != "episode_state"}
    return Request(r.request_id, r.prompt, r.max_new_tokens, r.key, group_id=r.group_id,
                   tokens=self.tokens, logprobs=self.logprobs, versions=self.versions,
                   min_version=r.min_version, meta=dict(meta, episode_state=state),
                   routes=self.routes_for(len(r.prompt) + len(self.tokens) - 1))

  @classmethod
  def from_request(cls, r: Request) -> "Episode":
    """A fresh episode, or an unfinished one resumed from `state_request()`'s output."""
    state = r.meta.get("episode_state")
    base = Request(r.request_id, r.prompt, r.max_new_tokens, r.key, group_id=r.group_id,
                   min_version=r.min_version,
                   meta={k: v for k, v in r.meta.items() if k != "episode_state"})
    if state is None:
      if r.num_generated:
        raise ValueError(f"request {r.request_id} carries {r.num_generated} tokens but no "
                         "episode state: only requests returned by the episode driver resume")
      return cls(base)
    ep = cls(base, tokens=r.tokens, logprobs=r.logprobs, versions=r.versions,
             turn=int(state["turn"]), turn_start=int(state["turn_start"]),
             phase=state["phase"], rewards=[float(x) for x in state["rewards"]],
             actions=list(state["actions"]), observations=[list(o) for o in
                                                           state["observations"]],
             env_snapshot=state.get("env_snapshot"), info=dict(state.get("info", {})),
             routes=r.routes if r.num_routed else None)
    return ep


def loss_mask(versions: np.ndarray) -> np.ndarray:
  """The loss mask of an episode's tokens: 1.0 where sampled (version >= 0), else 0.0."""
  return (np.asarray(versions) >= 0).astype(np.float32)

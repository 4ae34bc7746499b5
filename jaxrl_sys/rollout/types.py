"""Records exchanged between the trainer, the rollout manager and generation engines.

Everything here is plain data (numpy arrays, ints, strings) so it can cross process or machine
boundaries as msgpack without pickles. A request carries its token-level state, so a partial
response can be resumed on any engine: prompt + tokens so far, with the remaining budget.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np


class FinishReason(str, enum.Enum):
  STOP = "stop"          # a stop token was generated (it is included in the tokens)
  LENGTH = "length"      # the token budget (max_new_tokens) is exhausted
  ABORTED = "aborted"    # stopped from outside; the request can be resumed
  CONTEXT = "context"    # the engine's context length is exhausted


def request_key(seed: int, request_id: int) -> np.ndarray:
  """The per-request PRNG key (raw uint32[2]) used for every token of `request_id`.

  Computed on the host with the same layout as `jax.random.PRNGKey`, so a request samples the
  same tokens whichever engine, slot or batch serves it.
  """
  import jax  # pylint: disable=import-outside-toplevel
  return np.asarray(jax.random.fold_in(jax.random.PRNGKey(seed), request_id), np.uint32)


@dataclasses.dataclass
class Request:
  """One response to generate (one sample of one prompt).

  Attributes:
    request_id: unique id (int); also seeds the request's randomness.
    prompt: `[prompt_len]` int32 token ids.
    max_new_tokens: total response budget, including `tokens` already generated.
    key: raw PRNG key `[2]` uint32 (see `request_key`).
    group_id: the prompt's id; the G samples of one prompt share it (shared-prompt prefill).
    tokens / logprobs / versions: the partial response generated so far (`[n]` int32 / float32 /
      int32 weight version per token); empty for a fresh request.
    min_version: the oldest weight version allowed to generate the remaining tokens (for
      strict on-policy routing), or -1 for any.
    meta: free-form task data (e.g. the reference answer); not interpreted by engines.
    routes: MoE policies: `[m, layers, k]` expert ids (uint8 up to 256 experts) of the
      sequence positions fed to the model so far, in order: `prompt + tokens[:-1]`, so
      `m = len(prompt) + num_generated - 1` (position i's routes produced the token at i + 1);
      None or `m = 0` when none are recorded (a fresh request, a dense policy). They travel
      with the tokens: a resumed request's prefix is re-prefilled with them forced, and the
      trainer replays them (routing replay R3, `models.moe.replay`). A request may also enter
      an engine with the routes of a prefix of those positions only (`m` smaller: a multi-turn
      episode's next turn, whose observation tokens were never fed): the engine forces them,
      routes the rest live, and streams the rest.
  """
  request_id: int
  prompt: np.ndarray
  max_new_tokens: int
  key: np.ndarray
  group_id: int = -1
  tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  logprobs: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.float32))
  versions: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  min_version: int = -1
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)
  routes: np.ndarray | None = None

  def __post_init__(self):
    self.prompt = np.asarray(self.prompt, np.int32).reshape(-1)
    self.tokens = np.asarray(self.tokens, np.int32).reshape(-1)
    self.logprobs = np.asarray(self.logprobs, np.float32).reshape(-1)
    self.versions = np.asarray(self.versions, np.int32).reshape(-1)
    self.key = np.asarray(self.key, np.uint32).reshape(2)
    if self.prompt.size == 0:
      raise ValueError(f"request {self.request_id}: empty prompt")
    if not (len(self.tokens) == len(self.logprobs) == len(self.versions)):
      raise ValueError(f"request {self.request_id}: tokens/logprobs/versions lengths differ")
    if self.max_new_tokens < len(self.tokens):
      raise ValueError(f"request {self.request_id}: {len(self.tokens)} tokens already exceed "
                       f"max_new_tokens={self.max_new_tokens}")
    if self.routes is not None:
      self.routes = np.asarray(self.routes)
      if self.routes.ndim != 3 or self.routes.dtype.kind not in "ui":
        raise ValueError(f"request {self.request_id}: routes must be an integer array "
                         f"[positions, layers, k], got {self.routes.dtype} "
                         f"{list(self.routes.shape)}")
      self._check_routes()

  @property
  def num_routed(self) -> int:
    """Sequence positions whose routes are recorded (0 when none)."""
    return 0 if self.routes is None else int(self.routes.shape[0])

  def _check_routes(self) -> None:
    want = len(self.prompt) + len(self.tokens) - 1
    if self.num_routed > want:
      raise ValueError(
          f"request {self.request_id}: routes of {self.num_routed} positions for a prompt of "
          f"{len(self.prompt)} and {len(self.tokens)} tokens; a request records at most one per "
          f"fed position (prompt + tokens - 1 = {want})")

  @property
  def num_generated(self) -> int:
    return int(len(self.tokens))

  @property
  def remaining(self) -> int:
    return int(self.max_new_tokens - len(self.tokens))

  def extend(self, tokens, logprobs, version: int, routes=None) -> None:
    """Appends streamed tokens (all produced by weight `version`) and, for an MoE policy, the
    routes they add (`TokenChunk.routes`): afterwards the routes cover every fed position. A
    chunk that breaks that raises ValueError and leaves the request as it was."""
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    new_routes = self.routes
    if routes is not None:
      routes = np.asarray(routes)
      old = self.routes if self.num_routed else np.zeros((0,) + routes.shape[1:], routes.dtype)
      new_routes = np.concatenate([old, routes.astype(old.dtype)])
      want = len(self.prompt) + len(self.tokens) + len(tokens) - 1
      if len(new_routes) != want:
        raise ValueError(
            f"request {self.request_id}: routes of {len(new_routes)} positions for a prompt of "
            f"{len(self.prompt)} and {len(self.tokens) + len(tokens)} tokens; a request records "
            f"none or one per fed position (prompt + tokens - 1 = {want})")
    elif self.num_routed and len(tokens):
      raise ValueError(f"request {self.request_id}: {len(tokens)} tokens without routes extend "
                       "a request that records routes")
    self.routes = new_routes
    self.tokens = np.concatenate([self.tokens, tokens])
    self.logprobs = np.concatenate([self.logprobs, np.asarray(logprobs, np.float32).reshape(-1)])
    self.versions = np.concatenate([self.versions, np.full(len(tokens), version, np.int32)])

  def truncate(self, n: int) -> None:
    """Keeps the first `n` generated tokens (with their log-probs, versions and routes)."""
    n = int(n)
    self.tokens, self.logprobs = self.tokens[:n], self.logprobs[:n]
    self.versions = self.versions[:n]
    if self.num_routed:
      self.routes = self.routes[:len(self.prompt) + len(self.tokens) - 1]


@dataclasses.dataclass
class TokenChunk:
  """Tokens streamed by an engine for one request since its last chunk.

  `start` is the response index of `tokens[0]` (so a manager can detect gaps/duplicates);
  `finish` is None while the request is still running. `routes` (MoE policies, else None):
  `[m, layers, k]` expert ids of the positions this chunk adds to the request's route record
  (`Request.routes`): one per token, the fed position that produced it, preceded on a request's
  first chunk from an engine that routed its prefix live by that prefix's routes (then
  `m = len(tokens) + prefix length`); `Request.extend` appends them.
  """
  request_id: int
  start: int
  tokens: np.ndarray
  logprobs: np.ndarray
  version: int
  finish: FinishReason | None = None
  routes: np.ndarray | None = None

  def split(self) -> list["TokenChunk"]:
    """One chunk per token (`finish` on the last; the prefix routes go with the first)."""
    n = len(self.tokens)
    extra = 0 if self.routes is None else len(self.routes) - n
    out = []
    for j in range(n):
      r = None if self.routes is None else self.routes[(0 if j == 0 else extra + j):extra + j + 1]
      out.append(TokenChunk(self.request_id, self.start + j, self.tokens[j:j + 1],
                            self.logprobs[j:j + 1], self.version,
                            self.finish if j == n - 1 else None, r))
    return out


@dataclasses.dataclass
class Completion:
  """A finished response: the request (with its full token-level state) and why it ended."""
  request: Request
  finish: FinishReason

  @property
  def request_id(self) -> int:
    return self.request.request_id


class RolloutClient(Protocol):
  """Generation as a service: requests in, completions out, weight versions published.

  submit() never blocks on generation; poll() returns the responses completed since the last
  call (optionally waiting up to `timeout` seconds for at least `min_count`); abort() stops
  requests and returns their partial state (resumable later, e.g. APRIL partial rollouts);
  publish() makes version `version` the one used for tokens generated after it (an MoE
  policy publishes its balancing state with it: the routing biases change which experts run);
  snapshot() copies the token state of every unfinished request without stopping it (what a
  checkpoint saves; resubmitting the copies resumes them).
  """

  def submit(self, requests: Sequence[Request]) -> None: ...

  def poll(self, min_count: int = 0, timeout: float | None = None) -> list[Completion]: ...

  def abort(self, request_ids: Iterable[int] | None = None) -> list[Request]: ...

  def publish(self, params: Any, version: int, moe_state: Any = None) -> None: ...

  def num_pending(self) -> int: ...

  def snapshot(self) -> list[Request]: ...


TickHook = Callable[[Any, float], None]


class RolloutSession(RolloutClient, Protocol):
  """Everything the trainer's loop and its evaluators use of a rollout client, and nothing more.

  A session is built once by `rollout.setup.factory.make_client` (the run's composition root
  builds the training and the evaluation sessions) and handed to its users, which call only
  these methods. `rollout.RolloutManager` implements it over in-process, thread and Ray workers.

  The contract, beyond `RolloutClient`'s methods:
  - `submit` may be called at any time, also while earlier requests run, and requests are
    independent: completions come back in finishing order, tied to their origin by
    `Request.request_id`, `group_id` and `meta`. A driver that submits turn after turn (a
    multi-turn episode: each turn a request whose prompt is the episode so far, submitted when
    the previous turn and its tool results are in) needs nothing else. A routing constraint
    travels in the request itself (`Request.min_version` today), so a per-request routing
    hint or affinity joins it there, not the session.
  - `snapshot` is also how a driver observes streamed partial tokens: the copies hold every
    token generated so far (engines stream them in chunks of `EngineConfig.stream_every`).
  - `publish(params, version, moe_state)`: versions increase; requests with
    `min_version > version` wait for a newer one. A new session has no weights until the
    first publish.
  - `metrics()`: cumulative counters and gauges (tokens, migrated, lost, live_workers, pulls,
    ...); a user reports differences between two calls. `describe()`: one line of state for
    error messages (e.g. a stalled rollout). `close()`: ends the workers and the weight store
    (pending writes waited for); the session's builder calls it, once.
  - `add_tick_hook(hook)`: `hook(manager, now)` runs at every scheduling round of the session
    (fleets that start and stop workers, the offload controller); attached by whoever builds
    the session, never by the loop.
  """

  def metrics(self) -> dict[str, float]: ...

  def describe(self) -> str: ...

  def close(self) -> None: ...

  def add_tick_hook(self, hook: TickHook) -> None: ...

"""`AgentConfig`: the limits and switches of multi-turn episodes (the `--agent.*` flags)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Multi-turn episodes (`agents.EpisodeDriver`).

  Attributes:
    env: the episode environment, module:Class or path/to/file.py:Class, built once per
      episode (`tasks.env`); None: the task's own (`--task=calculator`, `--task=search`), or
      single-turn training when the task has none.
    max_turns: policy turns per episode at most; an episode still going after them ends
      (`episodes_max_turns`), its reward the sum of its per-turn rewards so far.
    max_turn_tokens: tokens one policy turn may sample (None: what is left of the episode's
      token budget, `--max_new_tokens`). The episode's tokens (sampled, observations and
      template glue) never exceed the budget: an observation that does not fit is cut, the
      episode ends and is left out of the gradient (`episodes_truncated`).
    tool_timeout: seconds a tool call may run before its observation says it timed out.
    tool_workers: tool calls running at once (threads; sandboxed tools in child processes).
    tool_output_chars: characters of a tool's output kept in its observation.
    env_workers: env steps running at once (each on a thread; they wait for their tools).
    prefetch: start calls of read-only tools before the policy finishes writing them (the
      env's predictor, and closed calls in the streamed tokens); a result is used only when
      the sampled call is exactly the predicted one, so episodes are the same with it on or off.
    prefetch_max: speculative calls in flight at most (over all episodes).
    turn_barrier: advance episodes batch-synchronously (every episode's turn generated, then
      every tool run, then the next turns): how peers run multi-turn rollout; for comparison.
    check_template: run the chat-template self-check when the driver starts.
  """
  env: str | None = None
  max_turns: int = 4
  max_turn_tokens: int | None = None
  tool_timeout: float = 30.0
  tool_workers: int = 8
  tool_output_chars: int = 4096
  env_workers: int = 64
  prefetch: bool = True
  prefetch_max: int = 64
  turn_barrier: bool = False
  check_template: bool = True

  def __post_init__(self):
    if self.max_turns < 1:
      raise ValueError(f"--agent.max_turns={self.max_turns} must be >= 1")
    if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
      raise ValueError(f"--agent.max_turn_tokens={self.max_turn_tokens} must be >= 1")
    if not self.tool_timeout > 0:
      raise ValueError(f"--tool_timeout={self.tool_timeout} must be > 0 seconds")
    if self.tool_workers < 1 or self.env_workers < 1:
      raise ValueError(f"--tool_workers={self.tool_workers} and --agent.env_workers="
                       f"{self.env_workers} must be >= 1")
    if self.tool_output_chars < 64:
      raise ValueError(f"--agent.tool_output_chars={self.tool_output_chars} must be >= 64")
    if self.prefetch_max < 0:
      raise ValueError(f"--agent.prefetch_max={self.prefetch_max} must be >= 0")

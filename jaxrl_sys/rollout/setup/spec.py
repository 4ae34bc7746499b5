"""Where rollout runs: `RolloutSetup`, the `rollout` section of a run's config (numpy only).

The clients it describes are built by `rollout.setup.factory.make_client` (in-process workers:
`rollout.setup.local`; Ray workers with a weight store and a fleet that follows a spot trace or
random kills: `rollout.setup.ray`, `experiments.grpo --rollout=ray --num_workers=N ...`).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

from jaxrl_sys.rollout.elastic.offload import OffloadConfig
from jaxrl_sys.rollout.elastic.trace_formats import load_trace
from jaxrl_sys.rollout.manager.config import ManagerConfig
from jaxrl_sys.rollout.weights.factory import check_spec

ROLLOUTS = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class RolloutSetup:
  """Where rollout runs.

  Attributes:
    rollout: "local" (in-process workers on the trainer's devices: the embedded default) or
      "ray" (Ray actor workers that may come and go).
    num_workers: Ray workers to run (the fleet's cap; with a trace, at most that many of the
      nodes the trace makes available).
    ray_address: a Ray cluster to join ("auto", "ray://head:10001"); None starts a local one.
    weight_store: "memory", "ray" or "tensorstore:PATH_OR_URL"; None = memory for local
      rollout, the Ray object store for Ray workers.
    preempt_trace: a spot trace (any `rollout.elastic.trace_formats` format; parsed and checked
      here, before Ray starts) whose adds and removes start and SIGKILL workers.
    trace_time_scale: host seconds per trace second (1/60: a trace minute per second).
    trace_sample: the fraction of the trace's nodes kept (seeded, as RLBoost kept 50%).
    chaos_kill_every: mean seconds between random SIGKILLs of a worker (0 = off; gaps uniform
      in [0.5, 1.5] x this), in serving time: the kill clock runs while a worker serves.
    chaos_restart_after: seconds before a chaos-killed worker's slot restarts.
    worker_cpus: Ray resources: CPUs per rollout worker.
    worker_gpus: Ray resources: GPUs per rollout worker.
    worker_token_delay: seconds each Ray worker sleeps per generated token (slow workers on
      purpose, for tests and benchmarks).
    heartbeat_timeout: seconds an exchange with a serving worker may take before the worker
      counts as lost.
    startup_timeout: the same for a worker that has no weights yet (process start, first
      pull, compile).
    max_request_failures: a request's failure budget (`ManagerConfig.max_attempts`): worker
      errors it may survive before the run fails; preemptions (killed or lost workers) never
      count.
    theta: requests a worker may hold beyond its free decode slots (delayed dispatch).
    offload: "off", "adaptive" (RLBoost seeding with the feedback controller) or a fixed
      window in seconds ("0": hand everything to the remote workers at once). With Ray workers
      and offload on, the trainer's devices are also a (local) worker.
    t_seed_init: the controller's first window, seconds (adaptive offload).
    worker_base_path: LoRA: a Hugging Face directory on every Ray worker's machine holding the
      base model; a worker reads the base from there when its digest is the trainer's (else
      it pulls the base from the weight store, once).
  """
  rollout: str = "local"
  num_workers: int = 2
  ray_address: str | None = None
  weight_store: str | None = None
  preempt_trace: str | None = None
  trace_time_scale: float = 1.0 / 60.0
  trace_sample: float = 1.0
  chaos_kill_every: float = 0.0
  chaos_restart_after: float = 2.0
  worker_cpus: float = 1.0
  worker_gpus: float = 0.0
  worker_token_delay: float = 0.0
  heartbeat_timeout: float = 30.0
  startup_timeout: float = 300.0
  max_request_failures: int = 5
  theta: int = 4
  offload: str = "off"
  t_seed_init: float = 2.0
  worker_base_path: str | None = None

  def __post_init__(self):
    for name, low, strict in (("worker_token_delay", 0, False), ("chaos_kill_every", 0, False),
                              ("chaos_restart_after", 0, False), ("worker_cpus", 0, False),
                              ("worker_gpus", 0, False),
                              ("heartbeat_timeout", 0, True), ("startup_timeout", 0, True)):
      value = getattr(self, name)
      if not (isinstance(value, (int, float)) and math.isfinite(value)
              and (value > low if strict else value >= low)):
        raise ValueError(f"rollout.{name}={value} must be a finite number "
                         f"{'>' if strict else '>='} {low}")
    if self.theta < 0:
      raise ValueError(f"rollout.theta={self.theta} must be >= 0")
    if self.rollout not in ROLLOUTS:
      raise ValueError(f"unknown rollout.rollout {self.rollout!r}; choose one of {ROLLOUTS}")
    if self.rollout == "ray" and self.num_workers < 1:
      raise ValueError(f"rollout.rollout=ray needs rollout.num_workers >= 1, got "
                       f"{self.num_workers}")
    if self.rollout == "local" and (self.preempt_trace or self.chaos_kill_every
                                    or self.offload != "off"):
      raise ValueError("rollout.preempt_trace, rollout.chaos_kill_every and rollout.offload act "
                       "on Ray workers: use them with rollout.rollout=ray")
    if self.preempt_trace and self.chaos_kill_every:
      raise ValueError("use either rollout.preempt_trace or rollout.chaos_kill_every, not both")
    if self.preempt_trace and not os.path.isfile(self.preempt_trace):
      raise ValueError(f"rollout.preempt_trace={self.preempt_trace}: no such file")
    if not (math.isfinite(self.trace_time_scale) and self.trace_time_scale > 0):
      raise ValueError(f"rollout.trace_time_scale must be a finite number > 0, got "
                       f"{self.trace_time_scale}")
    if self.preempt_trace:  # parsed and checked here, before Ray or any worker starts
      try:
        trace = load_trace(self.preempt_trace)
      except ValueError as err:
        raise ValueError(f"rollout.preempt_trace: {err}") from None
      if trace.max_live() == 0:
        raise ValueError(f"rollout.preempt_trace={self.preempt_trace}: the trace never makes an "
                         "instance available, so no rollout worker would ever start")
    if self.max_request_failures < 0:
      raise ValueError(f"rollout.max_request_failures must be >= 0, got "
                       f"{self.max_request_failures}")
    if self.chaos_kill_every < 0 or not 0 < self.trace_sample <= 1:
      raise ValueError("rollout.chaos_kill_every must be >= 0 and rollout.trace_sample in (0, 1]")
    self.offload_config()  # validates
    if self.rollout == "local" and self.weight_store not in (None, "memory"):
      raise ValueError(f"rollout.weight_store={self.weight_store} is for Ray workers; the local "
                       "rollout shares the trainer's weights in memory: drop "
                       "rollout.weight_store, or use rollout.rollout=ray")
    if self.weight_store:
      try:
        check_spec(self.weight_store)
      except ValueError as err:
        raise ValueError(f"rollout.weight_store: {err}") from None
    if self.rollout == "ray" and self.weight_store == "memory":
      raise ValueError("rollout.weight_store=memory only serves in-process workers; use "
                       "rollout.weight_store=ray or rollout.weight_store=tensorstore:PATH with "
                       "rollout.rollout=ray")

  def offload_config(self) -> OffloadConfig | None:
    """The controller's config, or None when offload is off."""
    if self.offload == "off":
      return None
    if self.offload == "adaptive":
      return OffloadConfig(t_init=self.t_seed_init)
    try:
      fixed = float(self.offload)
    except ValueError:
      fixed = -1.0
    if fixed < 0:
      raise ValueError(f"rollout.offload={self.offload!r}: use off, adaptive or a window in "
                       "seconds >= 0 (0 = offload everything)")
    return OffloadConfig(fixed=fixed)

  def manager_config(self) -> ManagerConfig:
    return ManagerConfig(theta=self.theta, heartbeat_timeout=self.heartbeat_timeout,
                         startup_timeout=self.startup_timeout,
                         max_attempts=self.max_request_failures)


@dataclasses.dataclass(frozen=True)
class ClientOptions:
  """How a client's workers start: what the run derives, not a setting of `RolloutSetup`.

  Attributes:
    local_workers: in-process engines: one `InProcessWorker`, or that many `ThreadWorker`s
      splitting the decode slots (`rollout.setup.local`); 0 = auto (`local_worker_count`).
    warmup: compile every prefill / decode shape of the in-process engines before the first
      request (no compilation stalls mid-run; a slower start). Ray workers always warm up.
    seed: seeds the Ray fleet's chaos schedule and trace sampling.
    compile_cache: the persistent compilation cache directory Ray workers use (None: none).
    message: prints the Ray fleet's one line per kill, start, join, loss and migration (None:
      silent).
  """
  local_workers: int = 0
  warmup: bool = False
  seed: int = 0
  compile_cache: str | None = None
  message: Callable[[str], None] | None = None

  def __post_init__(self):
    if self.local_workers < 0:
      raise ValueError(f"ClientOptions.local_workers must be >= 0 (0 = auto), got "
                       f"{self.local_workers}")

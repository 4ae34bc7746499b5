"""Where rollout runs (`RolloutSetup`) and the Ray client it builds: a
`RolloutManager` over Ray workers with a weight store and a fleet that follows a spot trace or
random kills (`experiments.grpo --rollout=ray --num_workers=N --preempt_trace=... ...`)."""
from __future__ import annotations

import dataclasses
import math
import os


from jaxrl_sys.models import ModelConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.elastic.fleet import Fleet
from jaxrl_sys.rollout.elastic.offload import OffloadConfig
from jaxrl_sys.rollout.elastic.schedules import ChaosSchedule, TracePlayer
from jaxrl_sys.rollout.elastic.trace_formats import load_trace
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.manager.config import ManagerConfig
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.weights.factory import make_weight_store
from jaxrl_sys.rollout.workers.server import InProcessWorker

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

  def __post_init__(self):
    if self.rollout not in ROLLOUTS:
      raise ValueError(f"unknown --rollout {self.rollout!r}; choose one of {ROLLOUTS}")
    if self.rollout == "ray" and self.num_workers < 1:
      raise ValueError(f"--rollout=ray needs --num_workers >= 1, got {self.num_workers}")
    if self.rollout == "local" and (self.preempt_trace or self.chaos_kill_every
                                    or self.offload != "off"):
      raise ValueError("--preempt_trace, --chaos_kill_every and --offload act on Ray workers: "
                       "use them with --rollout=ray")
    if self.preempt_trace and self.chaos_kill_every:
      raise ValueError("use either --preempt_trace or --chaos_kill_every, not both")
    if self.preempt_trace and not os.path.isfile(self.preempt_trace):
      raise ValueError(f"--preempt_trace={self.preempt_trace}: no such file")
    if not (math.isfinite(self.trace_time_scale) and self.trace_time_scale > 0):
      raise ValueError(f"--trace_time_scale must be a finite number > 0, got "
                       f"{self.trace_time_scale}")
    if self.preempt_trace:  # parsed and checked here, before Ray or any worker starts
      try:
        trace = load_trace(self.preempt_trace)
      except ValueError as err:
        raise ValueError(f"--preempt_trace: {err}") from None
      if trace.max_live() == 0:
        raise ValueError(f"--preempt_trace={self.preempt_trace}: the trace never makes an "
                         "instance available, so no rollout worker would ever start")
    if self.max_request_failures < 0:
      raise ValueError(f"--rollout.max_request_failures must be >= 0, got "
                       f"{self.max_request_failures}")
    if self.chaos_kill_every < 0 or not 0 < self.trace_sample <= 1:
      raise ValueError("--chaos_kill_every must be >= 0 and --trace_sample in (0, 1]")
    self.offload_config()  # validates
    if self.rollout == "local" and self.weight_store not in (None, "memory"):
      raise ValueError(f"--weight_store={self.weight_store} is for Ray workers; the local rollout "
                       "shares the trainer's weights in memory: drop --weight_store, or use "
                       "--rollout=ray")
    if self.rollout == "ray" and self.weight_store == "memory":
      raise ValueError("--weight_store=memory only serves in-process workers; use "
                       "--weight_store=ray or --weight_store=tensorstore:PATH with --rollout=ray")

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
      raise ValueError(f"--offload={self.offload!r}: use off, adaptive or a window in seconds "
                       ">= 0 (0 = offload everything)")
    return OffloadConfig(fixed=fixed)

  def manager_config(self) -> ManagerConfig:
    return ManagerConfig(theta=self.theta, heartbeat_timeout=self.heartbeat_timeout,
                         startup_timeout=self.startup_timeout,
                         max_attempts=self.max_request_failures)


def check_ray_resources(setup: RolloutSetup) -> None:
  """Raises a clear error when one worker asks for more than the whole Ray cluster has (it
  would wait for resources forever)."""
  from jaxrl_sys.rollout.workers.ray import import_ray  # pylint: disable=import-outside-toplevel
  have = import_ray().cluster_resources()
  for key, want, flag in (("CPU", setup.worker_cpus, "--worker_cpus"),
                          ("GPU", setup.worker_gpus, "--worker_gpus")):
    if want > have.get(key, 0.0):
      raise ValueError(
          f"each Ray rollout worker asks for {key}={want:g} but the Ray cluster has "
          f"{have.get(key, 0.0):g} {key}s in all ({setup.ray_address or 'local Ray'}): lower "
          f"{flag}, or add nodes with that resource (`ray start --address=...` on them)")


def ray_client(setup: RolloutSetup, model_config: ModelConfig, engine_config: EngineConfig, *,
               seed: int = 0, compile_cache: str | None = None,
               clock: Clock = WALL) -> RolloutManager:
  """A `RolloutManager` with no weights yet whose `Fleet` runs `setup.num_workers` Ray
  workers (following the trace or the chaos schedule); the loop publishes the weights."""
  # pylint: disable-next=import-outside-toplevel
  from jaxrl_sys.rollout.workers.ray import RayWorker, init_ray
  init_ray(setup.ray_address)
  check_ray_resources(setup)
  store = make_weight_store(setup.weight_store or "ray")
  manager = RolloutManager(store=store, config=setup.manager_config(), clock=clock)
  if setup.offload_config() is not None:
    manager.add_worker(InProcessWorker("trainer-0", model_config, engine_config, local=True,
                                       warmup=True))

  # Ready = compiled (every shape, from the persistent cache after the first worker): no stall
  # later, and the chaos clock (serving time) stands still meanwhile. warmup="idle" serves
  # sooner (1.8 s to the first tokens vs 5.6 s for the full warm-up, loaded 2-core host), but
  # under the serving clock it made the chaos loop test slower (36 workers lost vs 6): the
  # clock runs while an idle-warming worker compiles on demand.
  def factory(worker_id: str):
    return RayWorker(worker_id, model_config, engine_config, num_cpus=setup.worker_cpus,
                     num_gpus=setup.worker_gpus, token_delay=setup.worker_token_delay,
                     compile_cache=compile_cache, warmup=True)

  schedule, size = None, setup.num_workers
  if setup.preempt_trace:
    trace = load_trace(setup.preempt_trace)
    if setup.trace_sample < 1:
      trace = trace.sample(setup.trace_sample, seed)
    schedule = TracePlayer(trace, time_scale=setup.trace_time_scale)
  elif setup.chaos_kill_every:
    # Uniform gaps in [0.5, 1.5] x chaos_kill_every: random, but never a long quiet stretch.
    schedule = ChaosSchedule(setup.chaos_kill_every, seed=seed,
                             restart_after=setup.chaos_restart_after, slots=setup.num_workers,
                             distribution="uniform")
  # Chaos kill gaps are serving time (kills never leave a fleet that cannot serve); a trace
  # replays availability in real time.
  manager.add_tick_hook(Fleet(factory, schedule=schedule, size=size, cap=setup.num_workers,
                              serving_clock=bool(setup.chaos_kill_every)))
  return manager

"""Builds the loop's rollout client from flag-level settings: the in-process default, or a
`RolloutManager` over Ray workers with a weight store and a fleet that follows a spot trace or
random kills (`experiments.grpo --rollout=ray --num_workers=N --preempt_trace=... ...`)."""
from __future__ import annotations

import dataclasses
import math
import os
import threading

import jax

from jaxrl_sys.models import ModelConfig, SamplingConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.elastic.fleet import Fleet
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.manager.config import ManagerConfig
from jaxrl_sys.rollout.elastic.offload import OffloadConfig
from jaxrl_sys.rollout.elastic.schedules import ChaosSchedule, TracePlayer
from jaxrl_sys.rollout.workers.thread import ThreadWorker
from jaxrl_sys.rollout.elastic.traces import load_trace
from jaxrl_sys.rollout.types import RolloutClient
from jaxrl_sys.rollout.weights.factory import make_weight_store
from jaxrl_sys.rollout.workers.server import InProcessWorker
from jaxrl_sys.train.config import LoopConfig

ROLLOUTS = ("local", "ray")
# Auto mode splits the in-process rollout over two engines only when each keeps this many slots.
MIN_SLOTS_PER_LOCAL_WORKER = 32


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
    preempt_trace: a spot trace (Bamboo CSV or Parcae JSON lines) whose adds and removes start
      and SIGKILL workers; `trace_time_scale` host seconds per trace second, `trace_sample` the
      fraction of trace nodes kept (seeded, as RLBoost kept 50%).
    chaos_kill_every: mean seconds between random SIGKILLs of a worker (0 = off; gaps uniform
      in [0.5, 1.5] x this); a killed worker's slot restarts `chaos_restart_after` s later.
    worker_cpus, worker_gpus: Ray resources of each worker.
    worker_token_delay: seconds each Ray worker sleeps per generated token (slow workers on
      purpose, for tests and benchmarks).
    heartbeat_timeout, startup_timeout, theta: `ManagerConfig` settings.
    max_request_failures: a request's failure budget (`ManagerConfig.max_attempts`): worker
      errors it may survive; preemptions (killed or lost workers) never count.
    offload: "off", "adaptive" (RLBoost seeding with the feedback controller) or a fixed
      window in seconds ("0": hand everything to the remote workers at once). With Ray workers
      and offload on, the trainer's devices are also a (local) worker.
    t_seed_init: the controller's first window, seconds.
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
    if self.max_request_failures < 0:
      raise ValueError(f"--max_request_failures must be >= 0, got {self.max_request_failures}")
    if self.chaos_kill_every < 0 or not 0 < self.trace_sample <= 1:
      raise ValueError("--chaos_kill_every must be >= 0 and --trace_sample in (0, 1]")
    self.offload_config()  # validates
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

  def factory(worker_id: str):
    return RayWorker(worker_id, model_config, engine_config, num_cpus=setup.worker_cpus,
                     num_gpus=setup.worker_gpus, token_delay=setup.worker_token_delay,
                     compile_cache=compile_cache, warmup=True)  # ready = compiled: no stalls

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
  manager.add_tick_hook(Fleet(factory, schedule=schedule, size=size, cap=setup.num_workers))
  return manager


def check_lengths(model_config: ModelConfig, loop: LoopConfig) -> None:
  """Raises ValueError when the prompt bucket plus the response budget exceed the context."""
  if loop.seq_len > model_config.max_seq_len:
    raise ValueError(
        f"prompt longer than the context: max_prompt_len {loop.max_prompt_len} + max_new_tokens "
        f"{loop.max_new_tokens} = {loop.seq_len} > the model's max_seq_len "
        f"{model_config.max_seq_len}")


def default_engine_config(loop: LoopConfig, samples_per_group: int, eos_id: int):
  """An `EngineConfig` sized for the loop's in-flight requests. In-flight requests continue
  across a weight swap with their KV recomputed under the new weights (`recompute_kv_on_swap`),
  what aborting and resubmitting them would do, without leaving their worker."""
  groups = (loop.staleness + 1) * loop.prompts_per_step + extra_groups(loop)
  return EngineConfig(
      num_slots=min(groups * samples_per_group, 512), max_len=loop.seq_len,
      stream_every=min(8, loop.max_new_tokens),
      sampling=SamplingConfig(temperature=loop.temperature, stop_tokens=(eos_id,)),
      recompute_kv_on_swap=True)


def local_worker_count(loop: LoopConfig, num_slots: int) -> int:
  """Engines of the embedded rollout: `loop.local_workers`, or (0 = auto) two on a CPU host
  with at least two cores when each keeps at least `MIN_SLOTS_PER_LOCAL_WORKER` slots (one
  engine's small decode ops leave a core idle a third of the time there; see
  `rollout.workers.thread`), else one (an accelerator runs one engine's batch best)."""
  if loop.local_workers:
    return min(loop.local_workers, num_slots)
  if (jax.default_backend() == "cpu" and (os.cpu_count() or 1) >= 2
      and num_slots >= 2 * MIN_SLOTS_PER_LOCAL_WORKER):
    return 2
  return 1


def default_client(model_config: ModelConfig, params, loop: LoopConfig, eos_id: int, version: int,
                   samples_per_group: int, engine_config=None, moe_state=None, *,
                   warmup: bool = False, clock: Clock = WALL) -> RolloutClient:
  """The embedded default: a `RolloutManager` over the in-process workers on this process's
  devices (`local_worker_count`: one `InProcessWorker`, or `ThreadWorker`s sharing the engine
  config's slots), with the in-memory (zero-copy) weight store, serving `params` as `version`.
  """
  ec = engine_config or default_engine_config(loop, samples_per_group, eos_id)
  n = local_worker_count(loop, ec.num_slots)
  if n == 1:
    manager = RolloutManager([InProcessWorker("local-0", model_config, ec, warmup=warmup)],
                             clock=clock)
  else:
    # The slots split evenly; the rows/lengths buckets follow each engine's own slots.
    part = dataclasses.replace(ec, num_slots=-(-ec.num_slots // n), decode_row_buckets=())
    first_load = threading.Lock()
    workers = [ThreadWorker(f"local-{i}", model_config, part, warmup=warmup, first_load=first_load)
               for i in range(n)]
    # Equal engines: no measured plateau (a timing) decides a move, so a run repeats exactly;
    # an idle engine still takes half of the other's last running requests (tail balancing).
    manager = RolloutManager(workers, config=ManagerConfig(plateau_batch=part.num_slots),
                             clock=clock)
  manager.publish_weights(params, version, moe_state)
  return manager


def extra_groups(loop: LoopConfig) -> int:
  if loop.mode == "async":
    return 0
  return int(math.ceil(loop.prompts_per_step * loop.oversample)) - loop.prompts_per_step

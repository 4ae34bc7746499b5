"""The Ray rollout client: a `RolloutManager` over Ray workers with a weight store and a fleet
that follows a spot trace or random kills (`experiments.grpo --rollout=ray --num_workers=N
--preempt_trace=... ...`). Ray is imported when a client is built, not with this module."""
from __future__ import annotations

from jaxrl_sys.models import ModelConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.elastic.fleet import Fleet
from jaxrl_sys.rollout.elastic.schedules import ChaosSchedule, TracePlayer
from jaxrl_sys.rollout.elastic.trace_formats import load_trace
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.setup.spec import ClientOptions, RolloutSetup
from jaxrl_sys.rollout.weights.factory import make_weight_store
from jaxrl_sys.rollout.workers.server import InProcessWorker


def check_ray_resources(setup: RolloutSetup) -> None:
  """Raises a clear error when one worker asks for more than the whole Ray cluster has (it
  would wait for resources forever)."""
  from jaxrl_sys.rollout.workers.ray import import_ray  # pylint: disable=import-outside-toplevel
  have = import_ray().cluster_resources()
  for key, want, flag in (("CPU", setup.worker_cpus, "rollout.worker_cpus"),
                          ("GPU", setup.worker_gpus, "rollout.worker_gpus")):
    if want > have.get(key, 0.0):
      raise ValueError(
          f"each Ray rollout worker asks for {key}={want:g} but the Ray cluster has "
          f"{have.get(key, 0.0):g} {key}s in all ({setup.ray_address or 'local Ray'}): lower "
          f"{flag}, or add nodes with that resource (`ray start --address=...` on them)")


def ray_client(setup: RolloutSetup, model_config: ModelConfig, engine_config: EngineConfig, *,
               options: ClientOptions = ClientOptions(), clock: Clock = WALL) -> RolloutManager:
  """A `RolloutManager` with no weights yet whose `Fleet` runs `setup.num_workers` Ray
  workers (following the trace or the chaos schedule; `options.seed` seeds both), each with
  `options.compile_cache`; the caller publishes the weights. With offload on, the trainer's
  devices are a local worker too (always warmed up)."""
  seed, compile_cache = options.seed, options.compile_cache
  # pylint: disable-next=import-outside-toplevel
  from jaxrl_sys.rollout.workers.ray import RayWorker, init_ray
  # a local Ray in its own session: a signal to the run's process group reaches the trainer
  # only, which finishes its step (Ray still up), saves and stops Ray on its way out
  init_ray(setup.ray_address, own_session=True)
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
                     compile_cache=compile_cache, warmup=True,
                     base_path=setup.worker_base_path)

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
  # Chaos kill gaps are serving time (kills never leave a fleet that cannot serve) and kills
  # pause while no worker has finished starting since the previous one (a kill interval below
  # the start-up time would stop all progress); a trace replays availability in real time.
  chaos = bool(setup.chaos_kill_every)
  manager.add_tick_hook(Fleet(factory, schedule=schedule, size=size, cap=setup.num_workers,
                              serving_clock=chaos, pause_kills=chaos, message=options.message))
  return manager

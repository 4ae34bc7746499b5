"""How a run's rollout engines are sized for the loop's in-flight requests."""
from __future__ import annotations

from jaxrl_sys.models import ModelConfig, SamplingConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.rollout.setup.factory import make_client
from jaxrl_sys.rollout.setup.local import local_worker_count
from jaxrl_sys.rollout.setup.spec import ClientOptions, RolloutSetup
from jaxrl_sys.train.loop.config import LoopConfig, extra_groups


def default_engine_config(loop: LoopConfig, samples_per_group: int, eos_id: int) -> EngineConfig:
  """An `EngineConfig` sized for the loop's in-flight requests. In-flight requests continue
  across a weight swap with their KV recomputed under the new weights (`recompute_kv_on_swap`),
  what aborting and resubmitting them would do, without leaving their worker."""
  groups = (loop.staleness + 1) * loop.prompts_per_step + extra_groups(loop)
  return EngineConfig(
      num_slots=min(groups * samples_per_group, 512), max_len=loop.seq_len,
      stream_every=min(8, loop.max_new_tokens),
      sampling=SamplingConfig(temperature=loop.temperature, stop_tokens=(eos_id,)),
      recompute_kv_on_swap=True)


def embedded_client(model_config: ModelConfig, engine_config: EngineConfig, loop: LoopConfig, *,
                    warmup: bool = False, clock: Clock = WALL):
  """The in-process rollout client (`rollout.setup.factory`, no weights yet) with
  `loop.local_workers` engines (0 = `local_worker_count`'s choice)."""
  workers = local_worker_count(loop.local_workers, engine_config.num_slots)
  return make_client(RolloutSetup(), model_config, engine_config,
                     options=ClientOptions(local_workers=workers, warmup=warmup), clock=clock)

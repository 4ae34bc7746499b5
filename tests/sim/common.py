"""Small, fast simulator configurations shared by the sim tests."""
import dataclasses

from jaxrl_sys.rollout.elastic.traces import ADD, REMOVE, Trace, TraceEvent
from jaxrl_sys.sim.driver import SimConfig, Workload
from jaxrl_sys.sim.lengths import LengthDistribution
from jaxrl_sys.sim.presets import QWEN3_8B
from jaxrl_sys.sim.startup import Startup

# 16 prompts x 4 responses of ~1,000 tokens (at most 4,096): a step takes about a virtual
# minute of a Qwen3-8B cluster and a fraction of a second to simulate.
SMALL = Workload(prompts_per_step=16, group_size=4, prompt_tokens=64,
                 lengths=LengthDistribution(median=1000, sigma=0.6, max_tokens=4096,
                                            group_share=0.5), micro_batch_groups=4)
INSTANT = Startup(provision_s=0.0, container_s=0.0, engine_init_s=0.0)


def small(mode="rlboost", **kw) -> SimConfig:
  kw.setdefault("max_steps", 3)
  kw.setdefault("horizon", 1e6)
  return SimConfig(QWEN3_8B, mode=mode, workload=SMALL, startup=INSTANT, **kw)


def with_offload(cfg: SimConfig, **kw) -> SimConfig:
  return dataclasses.replace(cfg, offload=dataclasses.replace(cfg.offload, **kw))


def with_manager(cfg: SimConfig, **kw) -> SimConfig:
  return dataclasses.replace(cfg, manager=dataclasses.replace(cfg.manager, **kw))


def spot_trace(nodes: int, duration: float, removes: tuple = ()) -> Trace:
  """`nodes` instances from t = 0; `removes` = (time, node index) preemptions."""
  ev = [TraceEvent(0.0, ADD, f"n{i}") for i in range(nodes)]
  ev += [TraceEvent(t, REMOVE, f"n{i}") for t, i in removes]
  return Trace(tuple(ev), duration, "test")

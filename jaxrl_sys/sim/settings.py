"""The systems compared in the simulator: baselines, RLBoost, and one switch off at a time.

Every setting is the same driver (`sim.driver`) with a few fields changed, so the comparison is
between mechanisms, not implementations:

- baselines (RLBOOST.md 1.7): `colocated` (veRL: the reserved nodes generate, then train;
  no balancing between its engines, which veRL does not have: each engine keeps what it was
  given, dispatch stays late-binding), `colocated_2x` (veRL.2x: twice the reserved nodes;
  multi-node training at a lower MFU),
  `disagg` (Disagg.BAL, StreamRL-like: a fixed pool of reserved 2-GPU rollout instances sized
  to balance the stages, the nodes only train);
- `rlboost`: ours (seeding controller with memory and N_prem cap, pull-based weights, token-level
  migration keeping every token, continuous load balancing);
- the paper's ablations: `no_seeding` (offload everything: the window pinned at 0 by t_init =
  t_min = 0 and a negligible rate, so the controller still computes its N_prem cap - its
  `fixed` mode would switch the cap off too), `no_memory`, `restart`
  (restart-from-prompt instead of token migration), `sync_push` (weights pushed at the step
  start, everyone waits for the slowest, instances that start later wait for the next step);
- where our design goes beyond RLBoost's release (RLBOOST.md 8), each switched off: `trim_siblings`
  (the release's retry path trims a group's partial responses to the shortest sibling),
  `no_balance` (no continuous load balancing at all), `no_tail_balance` (RLBoost's
  `max(running - B, 0)` rule only: the tail of a batch is not split over idle workers),
  `no_cap` (no N_prem cap), `cap_from_inf` (the cap starts unbounded instead of at N_resv,
  so every live instance starts before step 0: this library's behaviour before it followed
  Algorithm 1), `cap_ceil` (the fleet runs ceil(N_prem) instances instead of floor(N_prem):
  this library's rounding before it followed "does not allocate beyond N_prem"), and
  `release` (trimming on, balancing and the cap off: the released system's behaviour).
"""
from __future__ import annotations

import dataclasses

from jaxrl_sys.sim.driver import SimConfig
from jaxrl_sys.sim.presets import ModelPreset

# Multi-node training efficiency: the presets train at MFU 0.35 on one node and 0.30 on two
# (FSDP crosses the inter-node fabric; sim/README.md). Doubling a one-node cluster pays that.
ONE_NODE_MFU, MULTI_NODE_MFU = 0.35, 0.30


@dataclasses.dataclass(frozen=True)
class Setting:
  """One system to simulate.

  Attributes:
    name: key; label: table row; group: "baseline", "ours", "paper ablation", "beyond paper".
    mode: the driver mode.
    reserved_scale: multiplies the reserved nodes (veRL.2x).
    manager / offload: `ManagerConfig` / `OffloadConfig` fields to override.
    sync_push: synchronous weight push.
  """
  name: str
  label: str
  group: str
  mode: str = "rlboost"
  reserved_scale: int = 1
  manager: tuple = ()
  offload: tuple = ()
  sync_push: bool = False

  @property
  def uses_trace(self) -> bool:
    return self.mode == "rlboost"


# veRL's rollout splits the batch over its engines and does not move requests between them;
# continuous load balancing is this library's (beyond the paper), so the baselines run without.
VERL_MANAGER = (("balance", False),)

_S = [
    Setting("colocated", "veRL (co-located, on-demand)", "baseline", mode="colocated",
            manager=VERL_MANAGER),
    Setting("colocated_2x", "veRL.2x (co-located, 2x nodes)", "baseline", mode="colocated",
            reserved_scale=2, manager=VERL_MANAGER),
    Setting("disagg", "Disagg.BAL (reserved rollout pool)", "baseline", mode="disagg"),
    Setting("rlboost", "RLBoost (ours)", "ours"),
    Setting("no_seeding", "- no seeding (T_seed = 0)", "paper ablation",
            offload=(("t_init", 0.0), ("t_min", 0.0), ("rate", 1e-9))),
    Setting("no_memory", "- no controller memory", "paper ablation",
            offload=(("memory", False),)),
    Setting("restart", "- restart from prompt", "paper ablation",
            manager=(("migrate_tokens", False),)),
    Setting("sync_push", "- synchronous weight push", "paper ablation", sync_push=True),
    Setting("no_balance", "- no continuous balancing", "beyond paper",
            manager=(("balance", False),)),
    Setting("no_tail_balance", "- no tail balancing", "beyond paper",
            manager=(("tail_balance", False),)),
    Setting("trim_siblings", "- trim siblings at migration", "beyond paper",
            manager=(("trim_siblings", True),)),
    Setting("no_cap", "- no N_prem cap", "beyond paper", offload=(("cap_workers", False),)),
    Setting("cap_from_inf", "- N_prem cap from infinity", "beyond paper",
            offload=(("cap_starts_at_resv", False),)),
    Setting("cap_ceil", "- N_prem cap rounded up", "beyond paper",
            offload=(("cap_ceil", True),)),
    Setting("release", "- all three (release-like)", "beyond paper",
            manager=(("balance", False), ("trim_siblings", True)),
            offload=(("cap_workers", False),)),
]
SETTINGS = {s.name: s for s in _S}


def get_settings(names: str) -> list[Setting]:
  """Settings from a comma list ("all" = every one); `colocated` is always included first."""
  want = list(SETTINGS) if names.strip() == "all" else [n.strip() for n in names.split(",")
                                                           if n.strip()]
  unknown = [n for n in want if n not in SETTINGS]
  if unknown:
    raise ValueError(f"unknown settings {unknown}; known: {sorted(SETTINGS)}")
  return [SETTINGS["colocated"]] + [SETTINGS[n] for n in want if n != "colocated"]


def scale_reserved(preset: ModelPreset, factor: int) -> ModelPreset:
  """The preset on `factor` times its reserved nodes; a one-node preset that becomes
  multi-node trains at the multi-node MFU (per-node rate scaled by 0.30 / 0.35)."""
  if factor == 1:
    return preset
  slow = ONE_NODE_MFU / MULTI_NODE_MFU if preset.train_nodes == 1 else 1.0
  return dataclasses.replace(preset, train_nodes=preset.train_nodes * factor,
                             train_s_per_token=preset.train_s_per_token * slow,
                             train_attn_s=preset.train_attn_s * slow)


def config_for(setting: Setting, base: SimConfig, disagg_instances: int = 0) -> SimConfig:
  """`base` with `setting` applied (`disagg_instances` for the disagg mode)."""
  return dataclasses.replace(
      base, mode=setting.mode, preset=scale_reserved(base.preset, setting.reserved_scale),
      manager=dataclasses.replace(base.manager, **dict(setting.manager)),
      offload=dataclasses.replace(base.offload, **dict(setting.offload)),
      sync_push=setting.sync_push,
      disagg_instances=disagg_instances if setting.mode == "disagg" else 0)

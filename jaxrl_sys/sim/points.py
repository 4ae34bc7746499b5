"""Ours for RLBoost's calibration figures: static pools, the length sweep under Algorithm 1's
cap, the controller's windows, the co-located rollout share, the release's 8B figures.

Every point is a simulation over a static pool of warm 2xH100 instances (`constant_trace`) or
co-located veRL, at steady state: the means over steps `skip`.. of `steps` (the controller
starts from its 150 s window and settles within a few steps). A `Plan` says how long the runs
are: `FULL` (10 steps, the first 3 skipped: `spot_sim --paper`, the opt-in tests) or `FAST`
(6 steps, 2 skipped: the calibration test the suite runs; ~3 s of CPU a Qwen3-14B run).

- static pool (RLBOOST.md 1.8: "a fixed number of instances", every one used, no cap):
  1 and 6 instances, and 12 for the saturation ("gains saturate once rollout keeps pace with
  training": 12 against 6);
- length sweep (cap 5K and 14K; "optimal N_prem grows 3 -> 6"): a pool of 12, larger than
  the paper's optimum, with Algorithm 1's N_prem cap on; the controller picks the fleet, and
  its N_prem, throughput and cost efficiency are the figures;
- windows: the T_seed the controller settles on per instance count (the release's commented
  14B memory table {1: 346, 2: 212, 3: 145, 4: 60, 5: 8, 6: 5} s and its shipped 8B one);
- the rollout share of a co-located step: (step - training) / step (RLBOOST.md 1.1: "up to 73%").

The cost efficiency of a static pool follows from its throughput (cost ratio 1 + n x $5.32 /
$83.79), so the static points constrain throughput; the capped sweep's cost follows from the
fleet the controller ran.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jaxrl_sys.rollout.elastic.traces import constant_trace
from jaxrl_sys.sim import experiment
from jaxrl_sys.sim.driver import SimConfig, Workload, simulate
from jaxrl_sys.sim.fit import FITTED, InstanceFit
from jaxrl_sys.sim.presets import QWEN3_14B, get_preset
from jaxrl_sys.sim.settings import SETTINGS, config_for
from jaxrl_sys.sim.startup import WARM_RESTART

CAP_5K, CAP_14K = 5120, 14336
SWEEP_POOL = 12  # instances offered to the length-sweep runs (more than the paper's optimum 6)


@dataclasses.dataclass(frozen=True)
class Plan:
  """How long each calibration run is: `steps` steps, the means over steps `skip`.. of them;
  `windows`: the 14B instance counts whose settled T_seed is measured."""
  steps: int = 10
  skip: int = 3
  windows: tuple[int, ...] = (1, 2, 3, 4, 5, 6)

  def __post_init__(self):
    if not 0 <= self.skip < self.steps:
      raise ValueError(f"Plan: need 0 <= skip < steps, got {self.skip}, {self.steps}")


FULL = Plan()
FAST = Plan(steps=6, skip=2, windows=(1, 6))


def pool_config(fit: InstanceFit, max_tokens: int = CAP_14K, steps: int = 10,
                preset=QWEN3_14B, capped: bool = False) -> SimConfig:
  """A static-pool run as RLBOOST.md describes it (1.8: a fixed number of instances; nothing
  fixes T_seed): the controller's adaptive window from its first value (150 s), warm
  instances, `steps` steps; every instance of the pool used (`capped=False`), or Algorithm 1's
  N_prem cap on (`capped=True`: the length sweep)."""
  base = SimConfig(fit.apply(preset), workload=Workload(lengths=fit.lengths(max_tokens)),
                   engine=fit.engine(), startup=WARM_RESTART, horizon=1e9, max_steps=steps)
  return dataclasses.replace(base, offload=dataclasses.replace(base.offload,
                                                               cap_workers=capped))



def measure(cfg: SimConfig, n: int, skip: int) -> dict[str, float]:
  """Steady-state means of `cfg` over a static pool of `n` instances (0: `cfg` in the
  co-located mode, no pool), steps `skip`.. : response and total (prompt + response) tokens/s,
  tokens per dollar (cost pro rata of time), T_seed, N_prem after each step, instances used,
  training time, step time, the trainer's wait and the rollout share of a step."""
  if n == 0:  # the veRL baseline as the grid runs it (`settings.SETTINGS["colocated"]`)
    res = simulate(config_for(SETTINGS["colocated"], cfg))
  else:
    res = simulate(cfg, constant_trace(n, 1e9))
  steps = res.steps[skip:]
  if not steps:
    raise ValueError(f"need more than {skip} steps, got {len(res.steps)}")
  wall = sum(s.end - s.start for s in steps)
  tokens = sum(s.tokens for s in steps)
  mean = lambda key: sum(getattr(s, key) for s in steps) / len(steps)  # noqa: E731
  step = wall / len(steps)
  return {"tok_s": tokens / wall, "total_tok_s": (tokens + sum(s.prompt_tokens for s in steps))
          / wall, "tok_per_dollar": tokens / (wall * res.cost / res.wall),
          "t_seed": mean("t_seed"), "n_prem": mean("n_prem"), "used": mean("workers_used"),
          "t_train": mean("t_train"), "step": step, "t_wait_train": mean("t_wait_train"),
          "rollout_share": 1.0 - mean("t_train") / step}


def _job(args) -> dict[str, float]:
  cfg, n, skip = args
  return measure(cfg, n, skip)


def calibration_runs(fit: InstanceFit = FITTED, plan: Plan = FULL,
                     jobs: int = 1) -> dict[tuple[int, int, bool], dict[str, float]]:
  """{(cap tokens, instances, capped): `measure` means} of every 14B calibration run."""
  keys = [(CAP_14K, 0, False), (CAP_14K, 12, False), (CAP_14K, SWEEP_POOL, True),
          (CAP_5K, 0, False), (CAP_5K, SWEEP_POOL, True)]
  keys += [(CAP_14K, n, False) for n in sorted(set(plan.windows) | {1, 6})]
  work = [(pool_config(fit, tokens, plan.steps, capped=capped), n, plan.skip)
          for tokens, n, capped in keys]
  return dict(zip(keys, experiment.parallel_map(_job, work, jobs)))


def calibration_points(fit: InstanceFit = FITTED, plan: Plan = FULL,
                       jobs: int = 1) -> dict[str, float]:
  """Ours for every figure of `paper.CALIBRATION` (14B static pools and length sweep) and
  `paper.CONTROLLER` (N_prem, saturation, windows, rollout share)."""
  r = calibration_runs(fit, plan, jobs)
  co14, co5 = r[(CAP_14K, 0, False)], r[(CAP_5K, 0, False)]

  def ratios(key, co):
    return r[key]["tok_s"] / co["tok_s"], r[key]["tok_per_dollar"] / co["tok_per_dollar"]

  out: dict[str, float] = {}
  for n in (1, 6):
    out[f"static {n} inst x"], out[f"static {n} inst ce"] = ratios((CAP_14K, n, False), co14)
  out["cap 5K x"], out["cap 5K ce"] = ratios((CAP_5K, SWEEP_POOL, True), co5)
  out["cap 14K x"], out["cap 14K ce"] = ratios((CAP_14K, SWEEP_POOL, True), co14)
  out["cap 5K N_prem"] = r[(CAP_5K, SWEEP_POOL, True)]["n_prem"]
  out["cap 14K N_prem"] = r[(CAP_14K, SWEEP_POOL, True)]["n_prem"]
  out["static 12 / 6 inst x"] = (r[(CAP_14K, 12, False)]["tok_s"]
                                 / r[(CAP_14K, 6, False)]["tok_s"])
  for n in plan.windows:
    out[f"14B {n} inst T_seed"] = r[(CAP_14K, n, False)]["t_seed"]
  out["co-located rollout share"] = co14["rollout_share"]
  return out


def release_points(fit: InstanceFit = FITTED, plan: Plan = FULL,
                   jobs: int = 1) -> dict[str, float]:
  """Ours for every `paper.RELEASE_8B` figure: Qwen3-8B static pools of 1-4 instances and
  co-located veRL, cap 14,336, steady state; tokens/s count prompt + response tokens as verl's
  `perf/throughput` does."""
  base = pool_config(fit, CAP_14K, plan.steps, get_preset("qwen3-8b"))
  counts = (1, 2, 3, 4)
  out = experiment.parallel_map(_job, [(base, n, plan.skip) for n in (0, *counts)], jobs)
  co = out[0]["total_tok_s"]
  res = {"8B colocated tok/s": co}
  for n, m in zip(counts, out[1:]):
    res[f"8B {n} inst x"] = m["total_tok_s"] / co
    res[f"8B {n} inst T_seed"] = m["t_seed"]
  return res


def static_pool(fit: InstanceFit, counts: Sequence[int], max_tokens: int = CAP_14K,
                plan: Plan = FULL, jobs: int = 1,
                preset=QWEN3_14B) -> dict[int, tuple[float, float]]:
  """{n: (throughput ratio, cost-efficiency ratio)} of a static pool of n instances (no cap)
  vs co-located veRL, both on `fit`."""
  base = pool_config(fit, max_tokens, plan.steps, preset)
  out = experiment.parallel_map(_job, [(base, n, plan.skip) for n in (0, *counts)], jobs)
  co: dict[str, Any] = out[0]
  return {n: (m["tok_s"] / co["tok_s"], m["tok_per_dollar"] / co["tok_per_dollar"])
          for n, m in zip(counts, out[1:])}

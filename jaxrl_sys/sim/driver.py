"""The simulated trainer: RL steps on a virtual clock over the real rollout manager.

`simulate(config, trace)` runs synchronous on-policy GRPO steps the way `train.loop` does, with
every rollout decision taken by the real code: `rollout.manager.RolloutManager` (routing with
version gating, token-level migration, continuous load balancing, weight pulls),
`rollout.elastic.offload.OffloadDriver` (the T_seed / N_prem controller) and
`rollout.elastic.fleet.Fleet` (trace-driven starts and preemptions within N_prem), over
`sim.worker.SimWorker`s.

One step (version v):
1. submit B x G requests (`min_version = v`; each carries its drawn length in `meta`);
2. seeding: `begin_step`; the trainer's GPUs run `N_resv` local engines until `deadline()`;
   `hand_off` (their unfinished requests migrate to remote instances);
3. training with dynamic micro-batching: as soon as `m_b` groups are complete (all left at the
   end) and no local engine holds work (the GPUs cannot generate and train at once), train them
   for `train_time`; the manager keeps running meanwhile (remote instances generate, new
   instances start and pull). Waiting for groups is `t_wait_train`;
4. optimizer, reshard and switch overhead; `end_step` feeds the controller; publish v + 1.

Modes: "rlboost" (local engines + spot instances from the trace), "colocated" (the local engines
generate everything, then the trainer trains: veRL; also what rlboost does with no spot
instance), "disagg" (a fixed pool of reserved rollout instances and a trainer that only trains:
StreamRL-like). Deterministic for `config.seed`.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_sys.rollout.clock import ManualClock
from jaxrl_sys.rollout.elastic.fleet import Fleet
from jaxrl_sys.rollout.manager.exchange import RolloutManager
from jaxrl_sys.rollout.manager.config import ManagerConfig
from jaxrl_sys.rollout.elastic.offload import OffloadConfig, OffloadDriver
from jaxrl_sys.rollout.elastic.schedules import TracePlayer
from jaxrl_sys.rollout.elastic.traces import Trace
from jaxrl_sys.rollout.types import Request
from jaxrl_sys.sim.cluster import SimCluster
from jaxrl_sys.sim.engine import EngineModel
from jaxrl_sys.sim.hardware import GCP_A3, Network
from jaxrl_sys.sim.lengths import LengthDistribution
from jaxrl_sys.sim.presets import ModelPreset
from jaxrl_sys.sim.prices import RLBOOST_PRICES, Prices
from jaxrl_sys.sim.result import SimResult, StepRecord
from jaxrl_sys.sim.startup import COLD_VM, Startup
from jaxrl_sys.sim.store import SimWeightStore
from jaxrl_sys.sim.timing import train_time
from jaxrl_sys.sim.worker import SimWorker

MODES = ("rlboost", "colocated", "disagg")
# The reasoning-length model of `sim.lengths` with half of the log-length variance shared by the
# responses of one prompt (hard prompts are long for every sample; an assumption, sim/README.md).
SIM_LENGTHS = LengthDistribution(group_share=0.5)
_KEY = np.zeros(2, np.uint32)


@dataclasses.dataclass(frozen=True)
class Workload:
  """The RL batch (RLBoost's setup, RLBOOST.md 1.7: 128 prompts x 8, max response 14K).

  Attributes:
    prompts_per_step: B, prompts (groups) per step.
    group_size: G, responses per prompt.
    prompt_tokens: prompt length (tokens); OpenR1-Math problems are short (release: max 512).
    lengths: response-length distribution (its `max_tokens` is the budget).
    micro_batch_groups: m_b, groups per dynamic micro-batch. The release sets
      `min_stream_batch_size=16` responses and divides it by n = 8 (`min_stream_prompts`,
      `sglang_rollout_remote.py`): 2 groups (this was 16 groups, 128 responses, until the fit
      of issue 29 read the code).
  """
  prompts_per_step: int = 128
  group_size: int = 8
  prompt_tokens: int = 256
  lengths: LengthDistribution = SIM_LENGTHS
  micro_batch_groups: int = 2


# The manager as the simulator runs it: ManagerConfig's defaults except where the virtual clock
# asks otherwise (waits end at the next event anyway; reports come every 10 s of virtual time;
# a trace may leave no instance for hours, which is what is studied, not a stall). The simulated
# store is healthy by construction (`sim.store`): a pull ends when the link has moved its bytes
# (`sim.senders`), however many instances share the link, and under the synchronous-push
# ablation an instance that starts mid-step waits for the next step's push, which may come more
# than an hour later. The pull deadline, which detects stores that fail, is therefore off.
SIM_MANAGER = ManagerConfig(poll_interval=10.0, startup_timeout=600.0, stall_timeout=math.inf,
                            load_timeout=math.inf)
# RLBoost's released controller: first window 150 s, floor 5 s, rate 1/3 (RLBOOST.md 1.2, 8).
SIM_OFFLOAD = OffloadConfig(t_init=150.0, t_min=5.0)


@dataclasses.dataclass(frozen=True)
class SimConfig:
  """One simulated run.

  Attributes:
    preset: model + hardware figures (its `train_nodes` are the reserved nodes).
    mode: "rlboost", "colocated" or "disagg" (see the module docstring).
    workload: the RL batch.
    engine: instance scheduler / reporting model.
    network: frontend links (weight pulls).
    startup: start-up delay of a spot instance.
    prices: on-demand and spot $/GPU-hour.
    offload: the controller's settings (`n_resv` is set from the local engines).
    manager: the rollout manager's settings.
    sync_push: synchronous weight push instead of pull (ablation).
    disagg_instances: reserved rollout instances of the "disagg" mode.
    horizon: virtual seconds simulated; the step running at the horizon is not counted.
    max_steps: stop after this many steps (None: the horizon decides).
    seed: all randomness (response lengths, start-up jitter).
    poll_timeout: seconds one wait for completions may take.
    warm_start: the instances live at the trace's start are up already (a segment is a window
      of a longer run); later ones pay the start-up delay.
    max_spot_instances: at most this many spot instances at once, on top of the controller's
      N_prem cap (None: no such cap). A diagnostic switch (`sim.diagnose`), not part of RLBoost.
  """
  preset: ModelPreset
  mode: str = "rlboost"
  workload: Workload = Workload()
  engine: EngineModel = EngineModel()
  network: Network = GCP_A3
  startup: Startup = COLD_VM
  prices: Prices = RLBOOST_PRICES
  offload: OffloadConfig = SIM_OFFLOAD
  manager: ManagerConfig = SIM_MANAGER
  sync_push: bool = False
  disagg_instances: int = 0
  horizon: float = 7200.0
  max_steps: int | None = None
  seed: int = 0
  poll_timeout: float = 60.0
  warm_start: bool = True
  max_spot_instances: int | None = None

  def __post_init__(self):
    if self.max_spot_instances is not None and self.max_spot_instances < 1:
      raise ValueError(f"SimConfig.max_spot_instances must be None or >= 1, got "
                       f"{self.max_spot_instances}")
    if self.mode not in MODES:
      raise ValueError(f"SimConfig.mode must be one of {MODES}, got {self.mode!r}")
    if self.mode == "disagg" and self.disagg_instances < 1:
      raise ValueError("SimConfig: the disagg mode needs disagg_instances >= 1")
    if not self.horizon > 0:
      raise ValueError(f"SimConfig.horizon must be > 0, got {self.horizon}")

  @property
  def local_engines(self) -> int:
    """N_resv: rollout engines on the reserved nodes (0 in the disagg mode)."""
    p = self.preset
    return 0 if self.mode == "disagg" else p.train_nodes * p.gpus_per_node // p.gpus_per_instance


class _Stop(Exception):
  """The horizon passed inside a step."""


class Simulation:
  """One run of `config` over `trace` (see the module docstring); `run()` -> `SimResult`."""

  def __init__(self, config: SimConfig, trace: Trace | None = None):
    self.cfg = c = config
    self.trace = trace if c.mode == "rlboost" else None
    self.clock = ManualClock(0.0)
    self.player = TracePlayer(self.trace) if self.trace is not None else None
    self.cluster = SimCluster(self.clock, c.preset, c.engine, n_senders=c.preset.train_nodes,
                              network=c.network, startup=c.startup,
                              rng=np.random.default_rng([c.seed, 1]), sync_push=c.sync_push,
                              player=self.player, warm_until=0.0 if c.warm_start else -1.0)
    local = [self.cluster.make_local(f"local-{i}") for i in range(c.local_engines)]
    self.manager = RolloutManager(local, SimWeightStore(c.preset.weight_bytes), c.manager,
                                  self.clock)
    self.cluster.manager = self.manager
    self.manager.add_tick_hook(self.cluster.reap)
    self.manager.add_tick_hook(self._watchdog)
    self.fleet = None
    if self.player is not None:
      self.fleet = Fleet(self.cluster.make_remote, schedule=self.player,
                         cap=c.max_spot_instances)
      self.manager.add_tick_hook(self.fleet)
    if c.mode == "disagg":
      for i in range(c.disagg_instances):
        w = SimWorker(f"rollout-{i}", self.cluster, local=False, ready_at=0.0,
                      sender=i % c.preset.train_nodes)
        self.cluster.workers[w.worker_id] = w
        self.manager.add_worker(w)
    offload = dataclasses.replace(c.offload, n_resv=max(c.local_engines, 1))
    if c.mode == "disagg":
      offload = dataclasses.replace(offload, fixed=0.0, cap_workers=False)
    self.driver = OffloadDriver(offload)
    self.manager.add_tick_hook(self.driver)
    if c.sync_push:
      self.manager.add_tick_hook(self._sync_guard)
    self.steps: list[StepRecord] = []
    self.version = 0
    self._groups: dict[int, int] = {}
    self._tokens: dict[int, int] = {}
    self._ready: list[int] = []
    self._last_done = 0.0
    self._same_time, self._ticks_now = -1.0, 0

  # ----- time ----------------------------------------------------------------------------------
  def _check_horizon(self) -> None:
    if self.clock.now() >= self.cfg.horizon:
      raise _Stop

  def _record(self, completions) -> None:
    g = self.cfg.workload.group_size
    for comp in completions:
      r = comp.request
      v = r.versions
      if len(v) and (v.min() != self.version or v.max() != self.version):
        raise AssertionError(f"request {r.request_id} of step {self.version} has tokens of "
                             f"versions {sorted(set(v.tolist()))} (on-policy violated)")
      gid = r.group_id
      self._groups[gid] = self._groups.get(gid, 0) + 1
      self._tokens[gid] = self._tokens.get(gid, 0) + r.num_generated
      if self._groups[gid] == g:
        self._ready.append(gid)
      self._last_done = self.clock.now()

  def _poll(self, timeout: float) -> float:
    t0 = self.clock.now()
    self._record(self.manager.poll(min_count=1, timeout=timeout))
    self._check_horizon()
    return self.clock.now() - t0

  def _run_until(self, end: float) -> None:
    """Lets the cluster run until `end` (the trainer is busy): completions are collected."""
    m = self.manager
    while self.clock.now() < end:
      if m.num_pending():
        self._record(m.poll(min_count=1 << 40, timeout=end - self.clock.now()))
        continue
      if m.round():
        continue
      ws = [self.cluster.workers[w] for w in m.fleet.outstanding()]
      left = end - self.clock.now()
      if ws:
        SimWorker.wait_any(ws, left, self.clock)
      else:
        self.clock.set(min(end, max(self.cluster.next_external(), self.clock.now())))

  def _train_for(self, seconds: float) -> None:
    """The reserved nodes train for `seconds`: their local engines make no progress."""
    now = self.clock.now()
    local = self.cluster.local()
    for w in local:
      w.freeze(now)
    self._run_until(now + seconds)
    for w in local:
      w.thaw(self.clock.now())
    self._check_horizon()

  def _local_idle(self) -> bool:
    fleet = self.manager.fleet
    return not any(fleet[w.worker_id].assigned for w in self.cluster.local()
                   if w.worker_id in fleet)

  def _watchdog(self, manager, now: float) -> None:
    """Fails loudly if the manager keeps acting without virtual time passing (a livelock)."""
    if now != self._same_time:
      self._same_time, self._ticks_now = now, 0
    self._ticks_now += 1
    if self._ticks_now > 100_000:
      raise RuntimeError(f"simulation stuck at t={now:.3f} s: 100000 manager ticks without "
                         f"time passing. {manager.describe()}")

  def _sync_guard(self, manager, now: float) -> None:  # pylint: disable=unused-argument
    """Synchronous push: when no remote instance can serve this step's version any more, the
    trainer's engines take the work back (instances that start later wait for the next step)."""
    if self.driver.handed_off and not self.cluster.can_serve(self.version):
      for w in self.cluster.local():
        if w.worker_id in manager.fleet:
          manager.set_accepting(w.worker_id, True)

  # ----- one step ------------------------------------------------------------------------------
  def _requests(self, step: int) -> list[Request]:
    w = self.cfg.workload
    n = w.prompts_per_step * w.group_size
    lengths = w.lengths.sample(np.random.default_rng([self.cfg.seed, 2, step]), n, w.group_size)
    prompt = np.zeros(w.prompt_tokens, np.int32)
    out = []
    for i in range(n):
      gid = step * w.prompts_per_step + i // w.group_size
      out.append(Request(gid * w.group_size + i % w.group_size, prompt, w.lengths.max_tokens, _KEY,
                         group_id=gid, min_version=step, meta={"target": int(lengths[i])}))
    return out

  def _step(self) -> StepRecord:
    c, m, clock = self.cfg, self.manager, self.clock
    wl, preset = c.workload, c.preset
    b = wl.prompts_per_step
    t0 = clock.now()
    self._groups, self._tokens, self._ready = {}, {}, []
    stats0 = m.fleet.stats.counters()
    m.submit(self._requests(self.version))
    self.driver.begin_step(m)
    deadline = self.driver.deadline()
    t_handoff = t0
    if deadline is not None:
      while len(self._ready) < b and clock.now() < deadline:
        self._poll(deadline - clock.now())
      t_handoff = clock.now()
      self.driver.hand_off(m)
    t_wait = t_train = 0.0
    trained, pending, tokens = 0, [], 0
    while trained < b:
      pending += self._ready
      self._ready = []
      n = len(pending) if trained + len(pending) == b else \
          len(pending) // wl.micro_batch_groups * wl.micro_batch_groups
      if n and self._local_idle():
        batch, pending = pending[:n], pending[n:]
        resp = [self._tokens[g] for g in batch]
        lens = [r / wl.group_size + wl.prompt_tokens for r in resp]
        total = sum(resp) + wl.prompt_tokens * wl.group_size * n
        mean_len = sum(x * x for x in lens) / sum(lens)
        dt = train_time(preset, total, mean_seq_len=mean_len)
        self._train_for(dt)
        t_train += dt
        trained += n
        tokens += sum(resp)
      else:
        t_wait += self._poll(c.poll_timeout)
    self._train_for(preset.step_overhead_s)
    t_train += preset.step_overhead_s
    offload = self.driver.end_step(m, t_wait, t_train)
    stats1 = m.fleet.stats.counters()
    rec = StepRecord(
        step=self.version, start=t0, end=clock.now(), handoff=t_handoff, tokens=tokens,
        prompt_tokens=b * wl.group_size * wl.prompt_tokens, t_wait_train=t_wait,
        t_train=t_train, t_seed=offload["t_seed"], t_seed_next=offload["t_seed_next"],
        t_wait_remote=offload["t_wait_remote"], t_remote=offload["t_remote"],
        last_done=self._last_done,
        workers_used=offload["workers_used"], n_prem_cap=offload["n_prem_cap"],
        remote_live=len(self.cluster.remote()),
        delta={k: stats1[k] - stats0.get(k, 0) for k in stats1}, n_prem=offload["n_prem"])
    self.version += 1
    m.publish(None, self.version)
    self.cluster.broadcast(self.version)
    return rec

  def run(self) -> SimResult:
    c = self.cfg
    self.manager.publish(None, 0)
    self.driver.apply_cap(self.manager)  # Algorithm 1: at most N_resv before step 0
    self.manager.round()  # the fleet starts the instances live at the start, within the cap
    self.cluster.broadcast(0)  # synchronous push: the instances up at the start get version 0
    try:
      while c.max_steps is None or len(self.steps) < c.max_steps:
        self._check_horizon()
        self.steps.append(self._step())
    except _Stop:
      pass
    end = self.steps[-1].end if self.steps else 0.0
    return SimResult.build(c, self.trace, self.steps, end, self.cluster, self.manager,
                           simulated=min(self.clock.now(), c.horizon))


def simulate(config: SimConfig, trace: Trace | None = None) -> SimResult:
  """Runs `config` (over `trace` in the rlboost mode) and returns its `SimResult`."""
  return Simulation(config, trace).run()

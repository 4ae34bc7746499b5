"""The host RL loop: prompts -> rollout -> rewards -> advantages -> train -> publish -> checkpoint.

Owns every side effect: the rollout client, signals, checkpoints, logs. One iteration:

1. admission (AReaL): resubmit aborted partials first, then admit new groups while
   `accepted < (eta + v + 1) * B (+ APRIL over-provisioning)`, v = the current weight version
   (= `state.step`), eta = 0 (sync), 1 (one_off) or `max_staleness` (async);
2. collection with dynamic micro-batching: poll completions; as soon as m_b groups are complete
   (oldest first) they are scored, packed and their gradient accumulated;
3. one optimizer update (global normalisation over the step's micro-batches);
4. one_off: the in-flight groups finish on the old weights (each sample from one version);
5. publish the new weights as version v + 1;
6. step boundary: unread completions are filed; in sync mode the APRIL over-provisioned
   requests still in flight are aborted into the buffer (resubmitted first at the next
   admission, their remaining tokens gated to the new version); in async mode in-flight requests
   keep generating on the new weights (the engine recomputes their KV on the swap: AReaL's
   interruptible generation); metrics are logged (a policy collapse is reported once:
   `train.loop.collapse`) and a checkpoint saved when due. The
   checkpoint holds the rollout client's `snapshot()` of in-flight token state, so a resumed run
   resubmits exactly what was in flight.

The rollout client is any `RolloutClient`; by default a `rollout.RolloutManager` over the
in-process workers (`rollout.InProcessWorker`, or two `rollout.ThreadWorker`s side by side on a
CPU host: `LoopConfig.local_workers`), or over Ray workers (see `train.recipe.rollout_setup`).
Time comes from an injected clock; the loop raises when no completion arrives for
`LoopConfig.stall_timeout` seconds while requests are pending.
SIGTERM or SIGINT (Ctrl-C) sets a flag: the current step finishes, a checkpoint is forced, and
`run` returns with `preempted=True` and `stop_signal` naming the signal. A second SIGINT stops
the run at the next safe point with `RunInterrupted`, after the save in flight is flushed; a
third exits the process (see `train.loop.stop_signals`).
A resumed run drops the metrics rows after the restored step (they are replayed).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models import ModelConfig
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.elastic.offload import OffloadConfig, OffloadDriver, OffloadState
from jaxrl_sys.rollout.types import RolloutClient
from jaxrl_sys.rollout.wire import request_to_json
from jaxrl_sys.sharding import DEFAULT_RULES, Rules
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.loop.buffer import Group, RolloutBuffer
from jaxrl_sys.train.loop.collapse import CollapseWatch
from jaxrl_sys.train.loop.checkpoint import Checkpointer, CheckpointsUnreadable
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.loop.config import CheckpointConfig, LoopConfig
from jaxrl_sys.train.loop.groups import group_requests, score_groups
from jaxrl_sys.train.loop.guard import DivergenceGuard
from jaxrl_sys.train.loop import multihost
from jaxrl_sys.train.loop.metrics_log import (MetricsLogger, Progress, client_counters, peak_flops,
                                              rollout_metrics, train_flops_per_token)
from jaxrl_sys.train.loop.local_client import check_lengths, default_client, extra_groups
from jaxrl_sys.train.step.state import (TrainState, init_train_state,
                                        state_shardings, with_shardings)
from jaxrl_sys.train.step.programs import train_programs
from jaxrl_sys.train.loop.step_stats import StepStats, step_stats
from jaxrl_sys.train.precision import PrecisionConfig, rollout_weights
from jaxrl_sys.train.loop.stop_signals import RunInterrupted, StopSignals  # noqa: F401 (re-export)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunResult:
  """state: the final TrainState; history: one metrics dict per step run in this call;
  preempted: True when SIGTERM / SIGINT (or `request_stop`) ended the run early; resumed_from:
  the checkpoint step restored at start (None for a fresh run); stop_signal: "SIGTERM" /
  "SIGINT" when a signal asked the run to stop (None otherwise)."""
  state: TrainState
  history: list[dict]
  preempted: bool
  resumed_from: int | None
  stop_signal: str | None = None


class UnreadableCheckpointsError(ValueError):
  """`--resume` found checkpoints, and none of them can be read."""


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _weights(state: TrainState, rollout_dtype: str, mesh=None):
  """The parameters in the rollout dtype (masters already in it go as they are: the train step
  does not donate them, so the in-memory store shares them with the engine) and a copy of the
  MoE state (donated). With `mesh` (one spanning several processes): this process's local view
  of both, for its own engine."""
  params, moe = rollout_weights(state.params, rollout_dtype), _copy(state.moe_state)
  return (params, moe) if mesh is None else multihost.localize((params, moe), mesh)


def _publish(client, state: TrainState, version: int, rollout_dtype: str, mesh=None) -> None:
  """Publishes `_weights(state, rollout_dtype, mesh)` as `version`."""
  params, moe = _weights(state, rollout_dtype, mesh)
  client.publish(params, version, moe)


class RLLoop:
  """GRPO-family training of `model_config` on `task` (see the module docstring).

  Args:
    model_config, train_config, loop_config: the configs.
    task, tokenizer: the verifiable task (`tasks.Task`) and its tokenizer (`encode(text,
      bos=...)`, `decode`, `eos_id`, `pad_id`).
    mesh: the training mesh.
    init_params: callable returning the initial parameters (called only for a fresh run, so a
      resumed run skips e.g. a supervised warm-up); None = random init from the seed.
    client: a RolloutClient; default `InProcessRollout` over the published weights.
    engine_config: config of the default in-process engine.
    checkpoint: checkpoint config (directory None = no checkpoints).
    resume: restore the newest usable checkpoint when there is one.
    out_dir: metrics (JSONL, TensorBoard) directory, or None.
    progress: show the stderr progress bar (bool), or a `metrics_log.Progress` to use.
    rules: logical-axis rules.
    warmup_engine: compile every prefill / decode variant of the default in-process engine
      before the first step (no compilation stalls mid-run; slower start).
    clock: the time source of the loop's timings and stall detection (`rollout.clock`).
    offload: adaptive rollout offload (`rollout.elastic.offload.OffloadConfig`): with a manager that
      has local and remote workers, the local ones generate for T_seed at the start of each
      step, then hand their requests to the remote ones; None = off.
    step_hooks: callables `hook(step, state, row)` run after each step, before its metrics
      row is logged; they may add entries to `row` (e.g. periodic evaluation).
    precision: dtypes of the masters / compute / rollout (`train.precision`; "auto" resolved
      here for the default backend); it overrides `model_config`'s dtypes. None = what
      `model_config` says, rollout in its compute dtype.
  """

  def __init__(self, model_config: ModelConfig, train_config: TrainConfig, loop_config: LoopConfig,
               task, tokenizer, mesh: jax.sharding.Mesh, *,
               init_params: Callable[[], Any] | None = None, client: RolloutClient | None = None,
               engine_config=None, checkpoint: CheckpointConfig = CheckpointConfig(),
               resume: bool = False, out_dir: str | None = None, progress: bool = False,
               rules: Rules = DEFAULT_RULES, warmup_engine: bool = False, clock: Clock = WALL,
               offload: OffloadConfig | None = None,
               step_hooks: Sequence[Callable[[int, TrainState, dict], None]] = (),
               precision: PrecisionConfig | None = None):
    check_lengths(model_config, loop_config)
    self.precision = (precision or PrecisionConfig.of_model(model_config)).resolve()
    model_config = self.precision.train_model(model_config)
    self.rollout_mc = self.precision.rollout_model(model_config)
    if abs(train_config.temperature - loop_config.temperature) > 0:
      raise ValueError(f"TrainConfig.temperature={train_config.temperature} must equal the "
                       f"sampling temperature {loop_config.temperature}")
    self.mc, self.tc, self.lc = model_config, train_config, loop_config
    self.task, self.tok, self.mesh, self.rules = task, tokenizer, mesh, rules
    # MC-GRPO draws G + 1 samples per prompt (the median pivot carries no gradient).
    median = train_config.advantage.baseline == "median"
    self.samples = loop_config.group_size + int(median)
    # Built once per process for equal configurations (`train.step.programs`).
    self.optimizer, self.schedule, self.abstract, self.fns = train_programs(
        model_config, train_config, self.precision.param_dtype, mesh, rules)
    self._init_params, self._client, self._engine_config = init_params, client, engine_config
    self._warmup_engine = warmup_engine
    self.clock = clock
    self.offload = offload
    self.driver: OffloadDriver | None = None
    self.client: RolloutClient | None = None
    self._last_progress = 0.0
    self.ckpt = Checkpointer(checkpoint) if checkpoint.directory else None
    self.ckpt_cfg, self.resume = checkpoint, resume
    # Several processes (a mesh spanning them): each builds its own rows of every batch with
    # its own co-located rollout engine (`train.loop.multihost`); process 0 alone writes metrics.
    self.hosts = None
    if multihost.spans_processes(mesh):
      multihost.check_loop_settings(loop_config, client, offload)
      self.hosts = multihost.ProcessGroup(mesh, rules, self.samples,
                                          loop_config.micro_batch_groups,
                                          self.fns.min_groups(self.samples))
      out_dir = out_dir if multihost.is_main() else None
    self.logger = MetricsLogger(out_dir)
    self.progress = (progress if isinstance(progress, Progress)
                     else Progress(loop_config.steps, bool(progress)))
    self.step_hooks = tuple(step_hooks)
    self.guard = DivergenceGuard("skip" if train_config.optim.skip_nonfinite else "stop")
    self.signals = StopSignals(self.progress.message)
    self.flops_per_token = train_flops_per_token(model_config, loop_config.seq_len,
                                                 reference=train_config.uses_reference,
                                                 scored_len=loop_config.max_new_tokens)

  # ----- state -------------------------------------------------------------------------------
  def request_stop(self) -> None:
    """Asks the loop to stop after the current step (what the SIGTERM handler does)."""
    self.signals.stop.set()

  def _start(self) -> tuple[TrainState, dict, int | None]:
    if self.resume and self.ckpt is not None:
      target = with_shardings(self.abstract, state_shardings(self.abstract, self.mc,
                                                             self.optimizer, self.mesh, self.rules))
      try:
        got = self.ckpt.restore(target)
      except CheckpointsUnreadable as e:
        raise UnreadableCheckpointsError(
            f"nothing can be resumed: every checkpoint in {self.ckpt.directory} is unreadable:\n"
            + "\n".join(f"  {n}" for n in e.notes) + "\nNothing was moved or deleted. To start "
            "the run again from scratch, pass --overwrite instead of --resume (deletes the run "
            "directory's outputs, its checkpoints/ included), or give another --out_dir / "
            "--checkpoint_dir") from None
      if got is not None and got.step > self.lc.steps:
        raise ValueError(
            f"--steps={self.lc.steps} is below step {got.step}, where the resumed run stands "
            f"({self.ckpt.directory}); give --steps above {got.step} to train further")
      if got is not None:
        host = got.host
        if host.get("samples_per_group") not in (None, self.samples):
          raise ValueError(f"checkpoint has {host['samples_per_group']} samples per group, this "
                           f"run {self.samples}; resume with the same --group_size / --algo")
        for note in got.skipped:
          self.progress.message(f"warning: {note}")
        self.progress.message(f"resumed from step {got.step} ({self.ckpt.directory})")
        return got.state, host, got.step
      self.progress.message(f"nothing to resume: {self.ckpt.directory} holds no checkpoint; "
                            "starting a fresh run")
    elif self.resume:
      self.progress.message("nothing to resume: no checkpoint directory; starting a fresh run")
    if self.ckpt is not None and not self.resume and self.ckpt.all_steps():
      raise ValueError(
          f"checkpoint directory {self.ckpt.directory} already holds checkpoints (steps "
          f"{self.ckpt.all_steps()}); resume from them (--resume) or use another directory")
    params = None if self._init_params is None else self._init_params()
    state = init_train_state(self.mc, self.tc, self.optimizer, mesh=self.mesh, seed=self.lc.seed,
                             params=params, rules=self.rules)
    return state, {"next_prompt": 0, "accepted": 0}, None

  def _host_state(self, buffer: RolloutBuffer, client=None) -> dict:
    """The loop's host state; the client's in-flight token state (`snapshot()`) is saved as
    partial requests, which a resumed run resubmits first."""
    data = buffer.to_json()
    if client is not None and hasattr(client, "snapshot"):
      data["partials"] = data["partials"] + [request_to_json(r) for r in client.snapshot()]
    out = {"next_prompt": self.next_prompt, "accepted": self.accepted,
           "samples_per_group": self.samples, "seed": self.lc.seed, "buffer": data}
    if self.driver is not None:
      out["offload"] = self.driver.state.to_json()
    return out

  # ----- rollout -----------------------------------------------------------------------------
  def _admit(self, client, buffer: RolloutBuffer, version: int) -> None:
    partials = buffer.take_partials()
    if partials:
      client.submit(partials)
    target = (self.lc.staleness + version + 1) * self.lc.prompts_per_step + extra_groups(self.lc)
    gids = []
    while self.accepted < target:
      gids.append(self.next_prompt)
      self.next_prompt += 1
      self.accepted += 1
    if self.hosts is not None:  # this process generates the groups that touch its rows
      gids = self.hosts.claim(gids)
    for gid in gids:
      buffer.add_group(gid, version)
    if gids:
      # Version-gated routing: sync (strict on-policy) and async (a new request starts on the
      # current weights, so its staleness counts from its admission) must not be served by
      # older weights; one_off accepts any version.
      min_version = version if self.lc.mode in ("sync", "async") else -1
      client.submit(group_requests(self.task, self.tok, gids, self.samples, seed=self.lc.seed,
                                   max_new_tokens=self.lc.max_new_tokens,
                                   max_prompt_len=self.lc.max_prompt_len,
                                   min_version=min_version))

  def _poll(self, client, buffer: RolloutBuffer) -> float:
    self.signals.check()
    t0 = self.clock.now()
    got = client.poll(min_count=1, timeout=self.lc.poll_timeout)
    now = self.clock.now()
    if got:
      self._last_progress = now
    elif not client.num_pending():
      raise RuntimeError("rollout stalled: no completions and nothing pending "
                         f"({len(buffer.groups)} groups buffered)")
    elif now - self._last_progress > self.lc.stall_timeout:
      describe = getattr(client, "describe", lambda: "")
      raise RuntimeError(
          f"rollout stalled: no completion for {now - self._last_progress:.0f} s "
          f"(LoopConfig.stall_timeout={self.lc.stall_timeout}) with {client.num_pending()} "
          f"requests pending. {describe()}")
    buffer.record(got)
    return now - t0

  def _seed(self, client, buffer: RolloutBuffer) -> float:
    """The seeding window: the trainer's devices generate (with the remote workers) until
    T_seed passes or the step's groups are complete, then hand their requests off. Returns the
    window's length (0 when the step does not seed)."""
    if self.driver is None:
      return 0.0
    self.driver.begin_step(client)
    deadline, t0 = self.driver.deadline(), self.clock.now()
    if deadline is None:
      return 0.0
    while len(buffer.complete_groups()) < self.lc.prompts_per_step:
      self.signals.check()
      left = deadline - self.clock.now()
      if left <= 0:
        break
      got = client.poll(min_count=1, timeout=left)
      if got:
        self._last_progress = self.clock.now()
      buffer.record(got)
    self.driver.hand_off(client)
    return self.clock.now() - t0

  # ----- one step ----------------------------------------------------------------------------
  def _train_step(self, state: TrainState, client, buffer: RolloutBuffer, version: int):
    lc, fns = self.lc, self.fns
    t_roll = t_train = 0.0
    taken: list[Group] = []
    acc = None
    scored = []
    pending_micro: list[Group] = []
    m, b = lc.micro_batch_groups, lc.prompts_per_step
    while len(taken) < b:
      self.signals.check()
      ready = self._ready(buffer, version, b - len(taken))
      if not ready:
        t_roll += self._poll(client, buffer)
        continue
      for g in ready:
        taken.append(buffer.pop(g.group_id))
        pending_micro.append(taken[-1])
      # Dynamic micro-batching: a micro-batch starts as soon as m_b groups are complete.
      n = len(pending_micro) if len(taken) == b else (
          len(pending_micro) // m * m if lc.dynamic_micro_batching else 0)
      if n:
        t0 = self.clock.now()
        plan = batch_lib.micro_batches(n, m, fns.min_groups(self.samples))
        batches = self._micro_batches(pending_micro[:n], plan, scored)
        pending_micro = pending_micro[n:]
        if acc is None and len(plan) == 1 and len(taken) == b:
          # The whole step is one micro-batch: gradient and update in one program.
          state, metrics = fns.fused_step(state, next(batches))
          metrics = jax.device_get(metrics)
          t_train += self.clock.now() - t0
          return state, metrics, taken, scored, t_roll, t_train
        for mb in batches:  # each packed on the host while the previous one computes
          acc = fns.accumulate(state, fns.init_accum(state, mb) if acc is None else acc, mb)
        t_train += self.clock.now() - t0
    t0 = self.clock.now()
    state, metrics = fns.apply(state, acc)
    metrics = jax.device_get(metrics)
    t_train += self.clock.now() - t0
    return state, metrics, taken, scored, t_roll, t_train

  def _ready(self, buffer: RolloutBuffer, version: int, room: int) -> list[Group]:
    """Complete groups to train now, oldest first, at most `room`. Async: a group admitted at
    version a trains by version a + max_staleness; while such an overdue group is still
    generating (delayed by a lost worker, say), newer groups leave room for it, so the trainer
    waits for it rather than exceed the bound."""
    ready = buffer.complete_groups()
    if self.lc.mode != "async":
      return ready[:room]
    due = version - self.lc.max_staleness
    late = sum(1 for g in buffer.groups.values() if g.admitted_version <= due and not g.complete)
    overdue = [g for g in ready if g.admitted_version <= due][:room]
    newer = [g for g in ready if g.admitted_version > due]
    return overdue + newer[:max(room - len(overdue) - late, 0)]

  def _micro_batches(self, groups: list[Group], plan: list[tuple[int, int]], scored: list):
    """Scores `groups` and packs them into device micro-batches following `plan`
    (`batch.micro_batches`: at most m_b groups each, sized to the groups present), one at a
    time as they are consumed."""
    i = 0
    for n, padded in plan:
      chunk, i = groups[i:i + n], i + n
      sc = score_groups(chunk, self.task, self.tok, self.tc.advantage, pad_to=padded)
      scored.append(sc)
      yield self.fns.put_batch(batch_lib.pack(sc.samples, padded * self.samples,
                                              self._row_length(sc.samples), self.tok.pad_id,
                                              window=self.lc.max_new_tokens))

  def _row_length(self, samples) -> int:
    """Packed row length of a micro-batch: what its rows need, in `batch.row_granule` steps."""
    return batch_lib.row_length(samples, self.lc.seq_len,
                                batch_lib.row_granule(self.lc.max_prompt_len),
                                window=self.lc.max_new_tokens)

  def _boundary(self, client, buffer: RolloutBuffer, version: int) -> None:
    """Files unread completions. Sync mode: the over-provisioned (APRIL) requests still in
    flight are aborted into the buffer; their remaining tokens must come from `version`, the
    one just published (strict on-policy routing). Async mode: in-flight requests keep going."""
    buffer.record(client.poll(timeout=0))
    if self.lc.mode == "sync":
      for r in client.abort():
        r.min_version = version
        buffer.partials.append(r)

  # ----- the loop ----------------------------------------------------------------------------
  def run(self) -> RunResult:
    """Runs until `state.step == loop.steps` or a stop request; returns the final state."""
    self.signals.install()
    try:
      return self._run()
    finally:
      self.signals.restore()

  def _run(self) -> RunResult:
    try:
      state, host, resumed = self._start()
    except BaseException:
      self._close()
      raise
    self.logger.keep_until(int(jax.device_get(state.step)))  # replayed steps are rewritten
    self.next_prompt, self.accepted = int(host["next_prompt"]), int(host["accepted"])
    buffer = (RolloutBuffer.from_json(host["buffer"]) if "buffer" in host
              else RolloutBuffer(self.samples))
    step = int(jax.device_get(state.step))
    client = self._client
    if client is None:
      params, moe = _weights(state, self.precision.rollout_dtype, self._publish_mesh)
      client = default_client(self.rollout_mc, params, self.lc, self.tok.eos_id, step,
                              self.samples, self._engine_config, moe,
                              warmup=self._warmup_engine, clock=self.clock)
    else:
      _publish(client, state, step, self.precision.rollout_dtype, self._publish_mesh)
    self.client = client
    if self.offload is not None and hasattr(client, "worker_times"):
      saved = host.get("offload")
      self.driver = OffloadDriver(self.offload,
                                  None if saved is None else OffloadState.from_json(saved))
      client.add_tick_hook(self.driver)
      self.driver.apply_cap(client)  # no worker beyond N_prem starts (Algorithm 1: N_resv)
    self._last_progress = self.clock.now()
    counters = client_counters(client)
    self.progress.phase("compiling... (first step)")
    history, preempted = [], False
    collapse = CollapseWatch(self.progress.message)  # says once when the policy collapses
    try:
      while step < self.lc.steps:
        self.signals.check()
        t_step = self.clock.now()
        self._admit(client, buffer, step)
        t_seed = self._seed(client, buffer)
        if self.hosts is None:
          state, metrics, taken, scored, t_roll, t_train = self._train_step(state, client,
                                                                               buffer, step)
          stats = step_stats(scored, taken, self._row_length)
        else:
          state, metrics, taken, stats, t_roll, t_train = self.hosts.train_step(
              self, state, client, buffer, step)
        offload_row = {} if self.driver is None else self.driver.end_step(client, t_roll, t_train)
        t_roll += t_seed
        if self.lc.mode == "one_off":
          while client.num_pending():  # finish the next batch on the weights that started it
            t_roll += self._poll(client, buffer)
        step += 1
        _publish(client, state, step, self.precision.rollout_dtype, self._publish_mesh)
        self._boundary(client, buffer, step)
        row = self._metrics(metrics, stats, t_roll, t_train, self.clock.now() - t_step, step - 1)
        now_counters = client_counters(client)
        row.update(rollout_metrics(counters, now_counters), **offload_row)
        counters = now_counters
        row["groups_buffered"] = len(buffer.groups)
        row["group_ids"] = list(stats.group_ids)
        for hook in self.step_hooks:
          hook(step, state, row)
        diverged = self.guard.check(step, row, self.ckpt)
        collapse.check(step, row)
        history.append(row)
        self.logger.log(step, row)
        self.progress.update(step, row, newline=step % max(self.lc.log_every, 1) == 0)
        if diverged is not None:  # logged, never checkpointed
          raise diverged
        stop = self.signals.stop.is_set()
        stop = multihost.agree_any(stop) if self.hosts else stop
        if self.ckpt is not None and (stop or step == self.lc.steps or (
            self.ckpt_cfg.save_every and step % self.ckpt_cfg.save_every == 0)):
          with self.signals.critical():
            self.ckpt.save(state, self._host_state(buffer, client), force=stop)
        if stop:
          preempted = step < self.lc.steps
          break
    finally:
      if self._client is None:
        client.close()  # the loop's own in-process workers: their threads end here
      self._close()  # waits for the checkpoint save in flight (also on a second SIGINT)
    return RunResult(state, history, preempted, resumed, self.signals.name)

  def _close(self) -> None:
    self.logger.close()
    self.progress.close()
    if self.ckpt is not None:
      with self.signals.critical():
        self.ckpt.close()

  def _metrics(self, metrics, stats: StepStats, t_roll, t_train, t_step, version) -> dict:
    rewards, lengths, stopped, versions = (stats.rewards, stats.lengths, stats.stopped,
                                           stats.versions)
    gen_tokens = int(lengths.sum())
    trained_positions = stats.trained_positions
    row = {k: (float(v) if np.ndim(v) == 0 else np.asarray(v).tolist())
           for k, v in metrics.items()}
    ndev = self.mesh.devices.size
    row.update(
        reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
        reward_max=float(rewards.max()), response_len_mean=float(lengths.mean()),
        response_len_max=float(lengths.max()), stop_frac=float(stopped.mean()),
        zero_variance_frac=stats.zero_variance / max(len(stats.group_ids), 1),
        off_policy_token_frac_host=float((versions < version).mean()) if versions.size else 0.0,
        token_staleness_max=int(version - versions.min()) if versions.size else 0,
        time_rollout=t_roll, time_train=t_train, time_step=t_step,
        tokens_per_s=gen_tokens / max(t_step, 1e-9),
        rollout_tokens_per_s=gen_tokens / max(t_roll, 1e-9),
        train_positions=trained_positions,
        train_tokens_per_s=trained_positions / max(t_train, 1e-9),
        mfu=self.flops_per_token * trained_positions / max(t_train, 1e-9) / (
            peak_flops() * ndev),
        next_prompt=self.next_prompt)
    return row

  @property
  def _publish_mesh(self):
    return None if self.hosts is None else self.mesh

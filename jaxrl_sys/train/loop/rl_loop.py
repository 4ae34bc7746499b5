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

The rollout client is a `rollout.types.RolloutSession` the caller builds (the recipe: the
in-process workers or Ray workers, `rollout.setup.factory.make_client`) and closes; the loop
only calls the protocol's methods. The run's arithmetic comes in a `plan.RunPlan` and the
jitted step in `step.programs.TrainPrograms`; hooks around the step (periodic evaluation, the
offload controller) are attached by the caller. The step itself is `local_step.LocalStep`, or
`process_group.ProcessGroup` when several processes share the mesh. Time comes from an
injected clock; the loop raises when no completion arrives for `LoopConfig.stall_timeout`
seconds while requests are pending.
SIGTERM or SIGINT (Ctrl-C) sets a flag: the current step finishes, a checkpoint is forced, and
`run` returns with `preempted=True` and `stop_signal` naming the signal. A second SIGINT stops
the run at the next safe point with `RunInterrupted`, after the save in flight is flushed; a
third exits the process (see `train.loop.stop_signals`).
A resumed run drops the metrics rows after the restored step (they are replayed).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Mapping, Sequence

import jax

from jaxrl_sys.models import init_params, lora
from jaxrl_sys.rollout.clock import WALL, Clock
from jaxrl_sys.rollout.types import RolloutSession
from jaxrl_sys.rollout.weights import BaseWeights
from jaxrl_sys.train.multihost import collectives as multihost
from jaxrl_sys.train.loop.buffer import RolloutBuffer
from jaxrl_sys.train.loop.collapse import CollapseWatch
from jaxrl_sys.train.loop.checkpoint import Checkpointer
from jaxrl_sys.train.loop.config import CheckpointConfig
from jaxrl_sys.train.loop.groups import group_requests
from jaxrl_sys.train.loop.guard import DivergenceGuard
from jaxrl_sys.train.loop.local_step import LocalStep
from jaxrl_sys.train.loop.metrics_log import (SUMMED_COUNTS, MetricsLogger, Progress,
                                              rollout_metrics, step_row,
                                              train_flops_per_token)
from jaxrl_sys.train.loop.plan import RunPlan
from jaxrl_sys.train.loop.process_group import ProcessGroup
from jaxrl_sys.train.loop.publish import publish, rollout_base
from jaxrl_sys.train.loop.resume import (  # UnreadableCheckpointsError: re-exported
    Resumable, UnreadableCheckpointsError, host_state, load_host_state, restore)  # noqa: F401
from jaxrl_sys.train.loop.stop_signals import StopSignals
from jaxrl_sys.train.step.programs import TrainPrograms
from jaxrl_sys.train.step.state import (TrainState, init_train_state, place_base,
                                        state_shardings, with_shardings)

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


StepHook = Callable[[int, TrainState, dict], None]


class RLLoop:
  """GRPO-family training of `plan.train_model` on `task` (see the module docstring).

  Args:
    plan: the run's plan (`loop.plan.RunPlan`: configs, samples per group, row lengths,
      precision, the version gate, the process layout).
    programs: the jitted step on the training mesh (`step.programs.train_programs` of the
      plan's train model and config).
    client: the rollout session (`rollout.types.RolloutSession`), built by the caller, which
      also closes it; the loop publishes every version to it, from the first.
    task, tokenizer: the verifiable task (`tasks.Task`) and its tokenizer
      (`tasks.base.Tokenizer`).
    init_params: callable returning the initial parameters (called only for a fresh run, so a
      resumed run skips e.g. a supervised warm-up); None = random init from the seed. With
      LoRA (`plan.train_model.lora`) it returns the frozen base and is called on resume too
      (the base is not checkpointed: a checkpoint records its digest and refuses another base).
    checkpoint: checkpoint config (directory None = no checkpoints).
    resume: restore the newest usable checkpoint when there is one.
    out_dir: metrics (JSONL, TensorBoard) directory, or None.
    progress: show the stderr progress bar (bool), or a `metrics_log.Progress` to use.
    clock: the time source of the loop's timings and stall detection (`rollout.clock`).
    step_hooks: callables `hook(step, state, row)` run after each step, before its metrics
      row is logged; they may add entries to `row` (e.g. periodic evaluation, the offload
      controller's step end).
    resumables: `{key: Resumable}`: host state of hooks, checkpointed with the loop's.
  """

  def __init__(self, plan: RunPlan, programs: TrainPrograms, client: RolloutSession, task,
               tokenizer, *, init_params: Callable[[], Any] | None = None,
               checkpoint: CheckpointConfig = CheckpointConfig(), resume: bool = False,
               out_dir: str | None = None, progress: bool | Progress = False,
               clock: Clock = WALL, step_hooks: Sequence[StepHook] = (),
               resumables: Mapping[str, Resumable] | None = None):
    self.plan, self.lc, self.client = plan, plan.loop, client
    self.task, self.tok = task, tokenizer
    self.optimizer, self.schedule, self.abstract, self.fns = programs
    self.mesh, self.rules = self.fns.mesh, self.fns.rules
    self._init_params = init_params
    self.base_digest: str | None = None  # LoRA: `models.lora.base_digest` of the frozen base
    self._base_weights = None
    self.clock = clock
    self._last_progress = 0.0
    self.ckpt = Checkpointer(checkpoint) if checkpoint.directory else None
    self.ckpt_cfg, self.resume = checkpoint, resume
    self.resumables = dict(resumables or {})
    self.progress = (progress if isinstance(progress, Progress)
                     else Progress(self.lc.steps, bool(progress)))
    self.signals = StopSignals(self.progress.message)
    # Several processes: each builds its own rows of every batch with its own co-located
    # rollout engine (`train.loop.process_group`); process 0 alone writes metrics.
    self.multi = plan.processes > 1
    if self.multi:
      self.stepper = ProcessGroup(plan, self.fns, task, tokenizer, self.mesh, self.rules,
                                  clock=clock)
      out_dir = out_dir if multihost.is_main() else None
    else:
      self.stepper = LocalStep(plan, self.fns, task, tokenizer, clock=clock,
                               check=self.signals.check)
    self.logger = MetricsLogger(out_dir)
    self.step_hooks = tuple(step_hooks)
    self.guard = DivergenceGuard("skip" if plan.train.optim.skip_nonfinite else "stop")
    self.flops_per_token = train_flops_per_token(plan.train_model, plan.seq_len,
                                                 reference=plan.train.uses_reference,
                                                 scored_len=self.lc.max_new_tokens)

  # ----- state -------------------------------------------------------------------------------
  def request_stop(self) -> None:
    """Asks the loop to stop after the current step (what the SIGTERM handler does)."""
    self.signals.stop.set()

  def _lora_base(self) -> Any:
    """LoRA: the frozen base (from `init_params`, fresh or resumed run) placed on the mesh in
    its own dtype; records its digest for the checkpoints and the rollout."""
    base = None if self._init_params is None else self._init_params()
    model = self.plan.train_model
    if base is None:
      base = init_params(lora.without_lora(model),
                         jax.random.fold_in(jax.random.PRNGKey(self.lc.seed), 1))
    base = place_base(base, model, self.mesh, self.rules)
    self.base_digest = lora.base_digest(base)
    if self.ckpt is not None:
      self.ckpt.base_digest = self.base_digest
    return base

  def _start(self) -> tuple[TrainState, dict, int | None]:
    base = self._lora_base() if self.plan.train_model.lora is not None else None
    if self.resume and self.ckpt is not None:
      target = with_shardings(self.abstract, state_shardings(
          self.abstract, self.plan.train_model, self.optimizer, self.mesh, self.rules))
      got = restore(self.ckpt, target, steps=self.lc.steps,
                    samples_per_group=self.plan.samples_per_group,
                    message=self.progress.message)
      if got is not None:
        state, host, step = got
        return state._replace(base=base), host, step
    elif self.resume:
      self.progress.message("nothing to resume: no checkpoint directory; starting a fresh run")
    if self.ckpt is not None and not self.resume and self.ckpt.all_steps():
      raise ValueError(
          f"checkpoint directory {self.ckpt.directory} already holds checkpoints (steps "
          f"{self.ckpt.all_steps()}); resume from them (--resume) or use another directory")
    if base is not None:
      params = base
    else:
      params = None if self._init_params is None else self._init_params()
    state = init_train_state(self.plan.train_model, self.plan.train, self.optimizer,
                             mesh=self.mesh, seed=self.lc.seed, params=params, rules=self.rules)
    return state, {"next_prompt": 0, "accepted": 0}, None

  def _host_state(self, buffer: RolloutBuffer) -> dict:
    """The loop's host state (`resume.host_state`), saved with every checkpoint."""
    return host_state(self.client, buffer, self.resumables, next_prompt=self.next_prompt,
                      accepted=self.accepted, samples_per_group=self.plan.samples_per_group,
                      seed=self.lc.seed)

  # ----- rollout -----------------------------------------------------------------------------
  def _admit(self, buffer: RolloutBuffer, version: int) -> None:
    client = self.client
    partials = buffer.take_partials()
    if partials:
      client.submit(partials)
    gids = []
    while self.accepted < self.plan.admitted_by(version):
      gids.append(self.next_prompt)
      self.next_prompt += 1
      self.accepted += 1
    gids = self.stepper.claim(gids)  # several processes: the groups that touch its rows
    for gid in gids:
      buffer.add_group(gid, version)
    if gids:
      lc = self.lc
      client.submit(group_requests(self.task, self.tok, gids, self.plan.samples_per_group,
                                   seed=lc.seed, max_new_tokens=lc.max_new_tokens,
                                   max_prompt_len=lc.max_prompt_len,
                                   min_version=self.plan.min_version(version)))

  def _poll(self, buffer: RolloutBuffer) -> float:
    """Files the completions of one poll into `buffer`; returns the seconds it waited."""
    client = self.client
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
      raise RuntimeError(
          f"rollout stalled: no completion for {now - self._last_progress:.0f} s "
          f"(loop.stall_timeout={self.lc.stall_timeout}) with {client.num_pending()} "
          f"requests pending. {client.describe()}")
    buffer.record(got)
    return now - t0

  def _boundary(self, buffer: RolloutBuffer, version: int) -> None:
    """Files unread completions. Sync mode: the over-provisioned (APRIL) requests still in
    flight are aborted into the buffer; their remaining tokens must come from `version`, the
    one just published (strict on-policy routing). Async mode: in-flight requests keep going."""
    buffer.record(self.client.poll(timeout=0))
    if self.lc.mode == "sync":
      for r in self.client.abort():
        r.min_version = version
        buffer.partials.append(r)

  # ----- the loop ----------------------------------------------------------------------------
  def run(self) -> RunResult:
    """Runs until `state.step == loop.steps` or a stop request; returns the final state."""
    with self.signals.installed():
      return self._run()

  def _run(self) -> RunResult:
    try:
      state, host, resumed = self._start()
    except BaseException:
      self._close()
      raise
    self.logger.keep_until(int(jax.device_get(state.step)))  # replayed steps are rewritten
    self.next_prompt, self.accepted, buffer = load_host_state(
        host, self.plan.samples_per_group, self.resumables)
    step = int(jax.device_get(state.step))
    client = self.client
    self._publish(state, step)
    self._last_progress = self.clock.now()
    counters = dict(client.metrics())
    self.progress.phase("compiling... (first step)")
    history, preempted = [], False
    poll = functools.partial(self._poll, buffer)
    collapse = CollapseWatch(self.progress.message)  # says once when the policy collapses
    try:
      while step < self.lc.steps:
        self.signals.check()
        t_step = self.clock.now()
        self._admit(buffer, step)
        state, metrics, taken, stats, t_roll, t_train = self.stepper.train_step(
            state, buffer, step, poll)
        if self.lc.mode == "one_off":
          while client.num_pending():  # finish the next batch on the weights that started it
            t_roll += poll()
        step += 1
        published = self._publish(state, step)
        self._boundary(buffer, step)
        row = step_row(metrics, stats, version=step - 1, t_roll=t_roll, t_train=t_train,
                       t_step=self.clock.now() - t_step, devices=self.mesh.devices.size,
                       flops_per_token=self.flops_per_token, next_prompt=self.next_prompt)
        row["publish_bytes"] = published
        now_counters = dict(client.metrics())
        rollout = rollout_metrics(counters, now_counters)
        if self.multi:  # each process generates its share: the job's counts are the sums
          rollout = multihost.sum_across(rollout, SUMMED_COUNTS)
        row.update(rollout)
        counters = now_counters
        row["groups_buffered"] = len(buffer.groups)
        if self.plan.train_model.moe is not None:  # this process's routes of its samples
          row["route_bytes"] = sum(int(c.request.routes.nbytes) for g in taken
                                   for c in g.completions() if c.request.routes is not None)
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
        stop = multihost.agree_any(stop) if self.multi else stop
        if self.ckpt is not None and (stop or step == self.lc.steps or (
            self.ckpt_cfg.save_every and step % self.ckpt_cfg.save_every == 0)):
          with self.signals.critical():
            self.ckpt.save(state, self._host_state(buffer), force=stop)
        if stop:
          preempted = step < self.lc.steps
          break
    finally:
      self._close()  # waits for the checkpoint save in flight (also on a second SIGINT)
    return RunResult(state, history, preempted, resumed, self.signals.name)

  def _publish(self, state: TrainState, version: int) -> int:
    """Publishes the parameters in the rollout dtype and the MoE state as `version` (several
    processes: this process's local view of both, for its own engine); with LoRA the adapters,
    naming the base (`_rollout_base`). Returns the bytes of the version (the base excluded)."""
    return publish(self.client, state, version, self.plan.precision.rollout_dtype,
                   self.mesh if self.multi else None, self._rollout_base(state))

  def _rollout_base(self, state: TrainState) -> BaseWeights | None:
    """LoRA: the base as published to the engines (the rollout dtype; cast once per run)."""
    if state.base is None:
      return None
    if self._base_weights is None or self._base_weights[0] is not state.base:
      weights = rollout_base(state.base, self.base_digest, self.plan.precision.rollout_dtype,
                             self.mesh if self.multi else None)
      arrays, self._base_weights = weights.params, (state.base, weights)
      adapters, base_bytes = lora.nbytes(state.params), lora.nbytes(state.base)
      self.progress.message(
          f"LoRA: base {self.base_digest} ({lora.nbytes(arrays) / 2**20:.1f} MiB) published "
          f"once; adapters {adapters / 2**20:.2f} MiB of float32 masters, "
          f"{adapters / max(base_bytes, 1):.2%} of the base's bytes")
    return self._base_weights[1]

  def _close(self) -> None:
    self.logger.close()
    self.progress.close()
    if self.ckpt is not None:
      with self.signals.critical():
        self.ckpt.close()

"""The pure, jitted train step: micro-batched gradient accumulation over a device mesh.

    step(state, batch[micro, rows, T]) -> (state, metrics)

is `apply(state, fold(accumulate, init_accum(state), micro-batches))`. The three pieces are
also exposed (jitted) so the host loop can accumulate a micro-batch as soon as its responses
are complete (dynamic micro-batching) and apply once at the end of the step.

Global normalisation: each micro-batch contributes the gradient of its loss *numerator*
(`policy_loss(..., denominator=1)`) and its denominator (`loss_denominator`); `apply` divides
the summed gradient by the summed denominator, which equals the gradient of
`sum(numerators) / sum(denominators)`, the full-batch loss, however the batch was split.
Precision (`train.precision`): the forward casts the masters to the compute dtype where they
are used; the gradient reaches the masters through that cast, is summed in float32 and goes to
the optimizer in float32, never rounded to the parameters' dtype.

Per token: log-probs and entropy come from `kernels.fused_logprobs(hidden, unembed, targets,
temperature)` at the temperature the responses were sampled at, read from the rollout's
`models.SamplingConfig` (`sampling=`: the one home of the setting; the full distribution at
that temperature), over the batch's scoring window (`batch.pack`): the response positions, not
the prompt's. The proximal policy of the decoupled loss is the
parameters before this update (one optimizer update per step), i.e. `stop_gradient` of the
same forward pass; the behaviour policy is the rollout engine's log-probs. The ratio is taken
against the proximal policy (exactly 1), or against the behaviour policy with
`loss.old_policy == "behaviour"` (coupled PPO: the clip binds on stale samples). The reference
policy (KL) is a frozen copy in the state, skipped when the KL coefficient is 0.

MoE routing replay (`TrainConfig.routing_replay`): "R3" runs the policy forward (and the
reference forward) with the rollout's routes from the batch (`batch.routes`, forced where
`batch.route_mask`), so the trainer scores the experts that produced the samples; "R2" routes
the policy forward live and replays its routes in the reference forward; "off" routes every
forward live. `routing_live_mismatch` (R3) adds a no-gradient forward with live routes and logs
its mismatch to the rollout log-probs (`mismatch_live_*`) beside the replayed one.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_sys import kernels
from jaxrl_sys.losses.aggregation import loss_denominator
from jaxrl_sys.losses.ess import ess_lr_scale, sequence_log_weights
from jaxrl_sys.losses.mismatch import mismatch_stats
from jaxrl_sys.losses.policy import policy_loss
from jaxrl_sys.models import ModelConfig, SamplingConfig, forward, unembedding
from jaxrl_sys.sharding import DEFAULT_RULES, Rules, logical_to_spec
from jaxrl_sys.sharding.axes import BATCH
from jaxrl_sys.train.step.batch import TrainBatch
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.step.state import TrainState, state_shardings

# Token-weighted means accumulated across micro-batches (keys of policy_loss's aux).
_TOKEN_MEANS = ("kl", "entropy", "clip_frac", "clip_frac_low", "clip_frac_high", "approx_kl",
                "ratio_mean", "behav_weight_mean", "behav_weight_capped_frac",
                "mismatch_mean", "mismatch_out_frac")
# MoE aux entries that are state (not sums) across micro-batches.
_MOE_LATEST = ("q",)
# The mismatch of a forward with live routes, under routing replay (`routing_live_mismatch`).
_LIVE_MEANS = ("mismatch_live_mean", "mismatch_live_out_frac")
# The sampling config of a step given none: temperature 1.
SAMPLING = SamplingConfig()


class Accum(NamedTuple):
  """Running sums over the micro-batches of one step.

  grads: parameter-shaped float32 sum of numerator gradients; denominator: float32 `[]`;
  sums: dict of float32 `[]` (token-weighted metric sums, `num_tokens`, `pg_numerator`, ...);
  lse_w / lse_w2: running logsumexp of the sequence log importance weights (and twice them)
  for the ESS; moe_aux: summed MoE auxiliary statistics (None for a dense model).
  """
  grads: Any
  denominator: jax.Array
  sums: dict
  lse_w: jax.Array
  lse_w2: jax.Array
  moe_aux: Any


def _moe():
  from jaxrl_sys.models.moe import block as moe  # pylint: disable=import-outside-toplevel
  return moe


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def score_window(hidden, start, width: int):
  """`hidden [rows, T, d]` at positions `start[:, None] + arange(width)` -> `[rows, width, d]`.

  The caller guarantees `start + width <= T` (`batch.pack` checks it). The backward is a gather
  too (position t of row r takes window entry `t - start[r]`, or 0 outside the window), not
  the scatter-add autodiff would emit.
  """
  pos = start[:, None] + jnp.arange(width, dtype=start.dtype)[None, :]
  return jnp.take_along_axis(hidden, pos[..., None], axis=1)


def _score_window_fwd(hidden, start, width):
  return score_window(hidden, start, width), (start, hidden.shape[1])


def _score_window_bwd(width, res, g):
  start, t = res
  j = jnp.arange(t, dtype=start.dtype)[None, :] - start[:, None]             # [rows, T]
  inside = (j >= 0) & (j < width)
  dh = jnp.take_along_axis(g, jnp.clip(j, 0, width - 1)[..., None], axis=1)
  return jnp.where(inside[..., None], dh, 0).astype(g.dtype), None


score_window.defvjp(_score_window_fwd, _score_window_bwd)


def batch_routes(model_config: ModelConfig, train_config: TrainConfig, batch: TrainBatch):
  """The rollout routes the policy forward replays (R3 with routes in the batch), else None."""
  if (model_config.moe is None or train_config.routing_replay != "R3"
      or batch.routes is None):
    return None
  from jaxrl_sys.models.moe import Routes  # pylint: disable=import-outside-toplevel
  return Routes(batch.routes, batch.route_mask)


def token_logprobs(params, model_config: ModelConfig, train_config: TrainConfig, batch: TrainBatch,
                   moe_state=None, sampling: SamplingConfig = SAMPLING, routes=None,
                   return_routes: bool = False):
  """Log-probs and entropy of `batch.targets` under `params` at `sampling.temperature`, on the
  scoring window only (no logits at the prompt positions before it). `routes`: MoE routes to
  replay (`models.moe.Routes`), None routes live; `return_routes` (static) also returns the
  forward's.

  Returns:
    (logprobs `[rows, W]` float32, entropy `[rows, W]` float32, MoE aux dict), and the forward's
    `Routes` last when `return_routes`.
  """
  out = forward(params, model_config, batch.tokens, attention_mask=batch.attention_mask,
                moe_state=moe_state, routes=routes, return_routes=return_routes,
                unroll_layers=model_config.num_layers <= train_config.unroll_layers_max)
  rows, t, d = out.hidden.shape
  w = batch.targets.shape[1]
  hidden = out.hidden if w == t else score_window(out.hidden, batch.score_start, w)
  lp, ent = kernels.fused_logprobs(
      hidden.reshape(rows * w, d), unembedding(params, model_config),
      batch.targets.reshape(rows * w), temperature=sampling.temperature,
      chunk_size=train_config.logprob_chunk, impl=train_config.logprob_impl)
  if return_routes:
    return lp.reshape(rows, w), ent.reshape(rows, w), out.aux, out.routes
  return lp.reshape(rows, w), ent.reshape(rows, w), out.aux


def _micro_loss(params, state: TrainState, mb: TrainBatch, model_config: ModelConfig,
                train_config: TrainConfig, sampling: SamplingConfig):
  tc = train_config
  fn = token_logprobs
  if tc.remat:
    fn = jax.checkpoint(token_logprobs, static_argnums=(1, 2, 5, 7))
  routes = batch_routes(model_config, tc, mb)
  r2 = model_config.moe is not None and tc.routing_replay == "R2"
  lp, ent, moe_aux, *own = fn(params, model_config, tc, mb, state.moe_state, sampling, routes,
                              r2)
  if r2:  # the policy forward's own routes, for the reference forward
    routes = jax.tree.map(jax.lax.stop_gradient, own[0])
  mask = mb.loss_mask
  ref = None
  if state.ref_params is not None:
    ref, _, _ = token_logprobs(state.ref_params, model_config, tc, mb, state.moe_state, sampling,
                               routes)
    ref = jax.lax.stop_gradient(ref)
  prox = jax.lax.stop_gradient(lp)
  # The ratio's anchor: the proximal policy (ratio 1, one update per step) or the behaviour
  # policy (coupled PPO: staleness moves the ratio; `PolicyLossConfig.old_policy`).
  old = mb.behav_logprobs if tc.loss.old_policy == "behaviour" else prox
  out = policy_loss(lp, old, mb.advantages, mask, config=tc.loss, ref_logprobs=ref,
                    behav_logprobs=mb.behav_logprobs if tc.loss.decoupled else None,
                    entropy=ent, denominator=jnp.ones([], jnp.float32))
  den = loss_denominator(mask, tc.loss.aggregation,
                         constant_length=tc.loss.drgrpo_constant_length)
  numerator = out.numerator
  if model_config.moe is not None:
    # Switch-style balancing loss (0 unless balancing == "aux_loss"), weighted by this
    # micro-batch's denominator so it averages over the step like the policy term.
    numerator = numerator + _moe().moe_aux_loss(moe_aux) * den
  log_w = sequence_log_weights(prox, mb.behav_logprobs, mask)
  # Trainer vs rollout-engine log-prob mismatch (numerics, plus staleness off-policy).
  aux = dict(out.aux, **mismatch_stats(prox, mb.behav_logprobs, mask))
  if live_mismatch(model_config, tc):
    live, _, _ = token_logprobs(params, model_config, tc, mb, state.moe_state, sampling)
    stats = mismatch_stats(jax.lax.stop_gradient(live), mb.behav_logprobs, mask)
    aux.update({k.replace("mismatch_", "mismatch_live_"): v for k, v in stats.items()})
  return numerator, (aux, den, log_w, jax.lax.stop_gradient(moe_aux))


def live_mismatch(model_config: ModelConfig, train_config: TrainConfig) -> bool:
  """Whether the step also measures the mismatch of live routing (`routing_live_mismatch`
  under R3, MoE only)."""
  return (model_config.moe is not None and train_config.routing_live_mismatch
          and train_config.routing_replay == "R3")


def init_accum(state: TrainState, mb: TrainBatch, *, model_config: ModelConfig,
               train_config: TrainConfig, sampling: SamplingConfig = SAMPLING) -> Accum:
  """Zero sums; `mb` (one micro-batch, or its ShapeDtypeStructs) only gives the MoE aux shapes."""
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
  moe_aux = None
  if model_config.moe is not None:
    shapes = jax.eval_shape(
        lambda p, b: token_logprobs(p, model_config, train_config, b, state.moe_state, sampling,
                                    batch_routes(model_config, train_config, b))[2],
        state.params, mb)
    moe_aux = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
  keys = _TOKEN_MEANS + ("loss_numerator", "num_tokens", "num_sequences", "pg_numerator",
                         "off_policy_tokens", "staleness_sum")
  if live_mismatch(model_config, train_config):
    keys += _LIVE_MEANS + ("mismatch_live_max",)
  sums = {k: jnp.zeros([], jnp.float32) for k in keys}
  sums["ratio_max"] = jnp.zeros([], jnp.float32)
  sums["mismatch_max"] = jnp.zeros([], jnp.float32)
  ninf = jnp.full([], -jnp.inf, jnp.float32)
  return Accum(zeros, jnp.zeros([], jnp.float32), sums, ninf, ninf, moe_aux)


def accumulate(state: TrainState, acc: Accum, mb: TrainBatch, *, model_config: ModelConfig,
               train_config: TrainConfig, sampling: SamplingConfig = SAMPLING) -> Accum:
  """Adds one micro-batch `[rows, T]` to the running sums (pure)."""
  grad_fn = jax.value_and_grad(_micro_loss, has_aux=True)
  (numerator, (aux, den, log_w, moe_aux)), grads = grad_fn(state.params, state, mb, model_config,
                                                            train_config, sampling)
  grads = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc.grads, grads)
  valid = mb.loss_mask != 0
  ntok = aux["num_tokens"].astype(jnp.float32)
  sums = dict(acc.sums)
  for k in _TOKEN_MEANS + _LIVE_MEANS:
    if k in aux:
      sums[k] = sums[k] + aux[k] * ntok
  if "mismatch_live_max" in aux:
    sums["mismatch_live_max"] = jnp.maximum(sums["mismatch_live_max"], aux["mismatch_live_max"])
  stale = jnp.where(valid, state.step - mb.versions, 0).astype(jnp.float32)
  sums.update(
      loss_numerator=sums["loss_numerator"] + numerator,
      num_tokens=sums["num_tokens"] + ntok,
      num_sequences=sums["num_sequences"] + aux["num_sequences"].astype(jnp.float32),
      pg_numerator=sums["pg_numerator"] + aux["pg_loss"],  # denominator 1: the numerator
      off_policy_tokens=sums["off_policy_tokens"] + jnp.sum(stale > 0),
      staleness_sum=sums["staleness_sum"] + jnp.sum(stale),
      ratio_max=jnp.maximum(sums["ratio_max"], aux["ratio_max"]),
      mismatch_max=jnp.maximum(sums["mismatch_max"], aux["mismatch_max"]))
  rows_valid = jnp.any(valid, axis=-1)
  lw = jnp.where(rows_valid, log_w, -jnp.inf)
  lse_w = jnp.logaddexp(acc.lse_w, jax.nn.logsumexp(lw))
  lse_w2 = jnp.logaddexp(acc.lse_w2, jax.nn.logsumexp(2 * lw))
  new_aux = None
  if acc.moe_aux is not None:
    # Loads and counts add up over the step; state-like entries (BIP duals "q") keep the latest.
    new_aux = {k: moe_aux[k].astype(v.dtype) + (0 if k in _MOE_LATEST else v)
               for k, v in acc.moe_aux.items()}
  return Accum(grads, acc.denominator + den, sums, lse_w, lse_w2, new_aux)


def apply(state: TrainState, acc: Accum, *, model_config: ModelConfig, train_config: TrainConfig,
          optimizer, schedule: Callable | None = None) -> tuple[TrainState, dict]:
  """Divides the summed gradient by the global denominator and applies one update (pure)."""
  tc = train_config
  den = acc.denominator
  inv = jnp.where(den > 0, 1.0 / jnp.where(den > 0, den, 1.0), 0.0)
  # float32 (accum dtype) into the optimizer, whatever the masters' dtype: never rounded to it.
  grads = jax.tree.map(lambda g: g * inv, acc.grads)
  nseq = acc.sums["num_sequences"]
  ess = jnp.where(nseq > 0, jnp.exp(2 * acc.lse_w - acc.lse_w2), 0.0)
  lr_scale = jnp.ones([], jnp.float32)
  if tc.ess_lr_scaling:
    lr_scale = jnp.where(nseq > 0, ess_lr_scale(ess, jnp.maximum(nseq, 1.0),
                                                base_ess_ratio=tc.base_ess_ratio,
                                                rule=tc.ess_rule), 1.0)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params, lr_scale=lr_scale)
  params = optax.apply_updates(state.params, updates)
  moe_state, moe_metrics = state.moe_state, {}
  if model_config.moe is not None and acc.moe_aux is not None:
    moe = _moe()
    moe_state = moe.update_moe_state(state.moe_state, acc.moe_aux, model_config)
    moe_metrics = dict(moe.moe_metrics(acc.moe_aux))
  ntok = jnp.maximum(acc.sums["num_tokens"], 1.0)
  metrics = {k: acc.sums[k] / ntok for k in _TOKEN_MEANS + _LIVE_MEANS if k in acc.sums}
  if "mismatch_live_max" in acc.sums:
    metrics["mismatch_live_max"] = acc.sums["mismatch_live_max"]
  metrics.update(
      loss=_safe_div(acc.sums["loss_numerator"], den),
      pg_loss=_safe_div(acc.sums["pg_numerator"], den),
      grad_norm=optax.global_norm(grads),
      update_norm=optax.global_norm(updates),
      ess=ess, ess_frac=_safe_div(ess, nseq), lr_scale=lr_scale,
      num_tokens=acc.sums["num_tokens"], num_sequences=nseq,
      off_policy_token_frac=acc.sums["off_policy_tokens"] / ntok,
      staleness_mean=acc.sums["staleness_sum"] / ntok,
      ratio_max=acc.sums["ratio_max"], mismatch_max=acc.sums["mismatch_max"],
      denominator=den)
  if schedule is not None:
    metrics["learning_rate"] = schedule(state.step) * lr_scale
  metrics.update(moe_metrics)
  new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                         ref_params=state.ref_params, moe_state=moe_state, rng=state.rng)
  return new_state, metrics


def _safe_div(a, b):
  return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), 0.0)


def fused_step(state: TrainState, mb: TrainBatch, *, model_config: ModelConfig,
               train_config: TrainConfig, optimizer, schedule=None,
               sampling: SamplingConfig = SAMPLING) -> tuple[TrainState, dict]:
  """A step whose batch is one micro-batch `[rows, T]`: `apply(accumulate(init_accum))` as one
  program (pure). The zero sums fold away and the gradient goes straight into the optimizer,
  with no accumulator written and read back between programs."""
  kw = dict(model_config=model_config, train_config=train_config)
  acc = accumulate(state, init_accum(state, mb, sampling=sampling, **kw), mb, sampling=sampling,
                   **kw)
  return apply(state, acc, optimizer=optimizer, schedule=schedule, **kw)


def train_step(state: TrainState, batch: TrainBatch, *, model_config: ModelConfig,
               train_config: TrainConfig, optimizer, schedule=None,
               sampling: SamplingConfig = SAMPLING) -> tuple[TrainState, dict]:
  """One optimizer update from `batch` `[micro, rows, T]` (pure; scan over micro-batches);
  log-probs at `sampling.temperature`, the temperature the rollout sampled the batch at."""
  kw = dict(model_config=model_config, train_config=train_config)
  first = jax.tree.map(lambda x: x[0], batch)
  acc = init_accum(state, first, sampling=sampling, **kw)
  acc, _ = jax.lax.scan(lambda a, mb: (accumulate(state, a, mb, sampling=sampling, **kw), None),
                        acc, batch)
  return apply(state, acc, optimizer=optimizer, schedule=schedule, **kw)


def batch_sharding(mesh: jax.sharding.Mesh, shape: tuple[int, ...], stacked: bool,
                   rules: Rules = DEFAULT_RULES) -> NamedSharding:
  """Rows over the `batch` logical axis (data parallel); a leading micro axis is unsharded."""
  axes = ((None,) if stacked else ()) + (BATCH,) + (None,) * (len(shape) - 1 - int(stacked))
  return NamedSharding(mesh, logical_to_spec(axes, mesh, shape, rules))


@dataclasses.dataclass(frozen=True)
class TrainFns:
  """The jitted step and its pieces, bound to one model, config, optimizer and mesh.

  Attributes:
    step: `(state, batch[micro, rows, T]) -> (state, metrics)`; donates the state.
    init_accum: `(state, micro_batch) -> Accum`.
    accumulate: `(state, acc, micro_batch[rows, T]) -> acc`; donates acc.
    apply: `(state, acc) -> (state, metrics)`; donates the state except its parameters.
    fused_step: `(state, micro_batch[rows, T]) -> (state, metrics)`, a step of one micro-batch
      (`init_accum`, `accumulate` and `apply` in one program); donates as `apply` does.
    shardings: `TrainState` of NamedShardings.
    mesh: the mesh.
  """
  step: Callable
  init_accum: Callable
  accumulate: Callable
  apply: Callable
  fused_step: Callable
  shardings: TrainState
  mesh: jax.sharding.Mesh
  rules: Rules

  def min_groups(self, samples_per_group: int) -> int:
    """Fewest groups whose rows (`samples_per_group` each) split evenly over the devices that
    shard the batch (1 without data parallelism)."""
    spec = logical_to_spec(("batch",), self.mesh, None, self.rules)[0]
    axes = () if spec is None else ((spec,) if isinstance(spec, str) else tuple(spec))
    shards = math.prod(self.mesh.shape[a] for a in axes)
    return shards // math.gcd(shards, samples_per_group)

  def put_batch(self, batch: TrainBatch) -> TrainBatch:
    """Places a host batch (`[rows, T]` or `[micro, rows, T]`) on the mesh."""
    stacked = batch.tokens.ndim == 3
    return TrainBatch(*(None if x is None else
                        jax.device_put(x, batch_sharding(self.mesh, x.shape, stacked, self.rules))
                        for x in batch))


def make_train_fns(model_config: ModelConfig, train_config: TrainConfig, optimizer, abstract,
                   mesh: jax.sharding.Mesh, *, rules: Rules = DEFAULT_RULES, schedule=None,
                   donate: bool = True, sampling: SamplingConfig = SAMPLING) -> TrainFns:
  """Jits the step pieces with the state's shardings on `mesh` as output shardings.

  Args:
    model_config, train_config, optimizer, sampling: as for `train_step`.
    abstract: `state.abstract_state(...)` (gives the state's structure).
    mesh: the training mesh; inputs are expected already placed (see `TrainFns.put_batch`).
    rules: logical-axis rules.
    schedule: optional learning-rate schedule, for the `learning_rate` metric.
    donate: donate the state / accumulator buffers to the outputs.
  """
  sh = state_shardings(abstract, model_config, optimizer, mesh, rules)
  rep = NamedSharding(mesh, P())
  acc_sh = Accum(grads=sh.params, denominator=rep, sums=rep, lse_w=rep, lse_w2=rep,
                 moe_aux=None if model_config.moe is None else rep)
  kw = dict(model_config=model_config, train_config=train_config)
  opt = dict(optimizer=optimizer, schedule=schedule)

  def _step(state, batch):
    return train_step(state, batch, sampling=sampling, **kw, **opt)

  def _init(state, mb):
    return init_accum(state, mb, sampling=sampling, **kw)

  def _acc(state, acc, mb):
    return accumulate(state, acc, mb, sampling=sampling, **kw)

  d = (lambda *a: a) if donate else (lambda *a: ())

  def _params_last(fn):
    # The parameters are not donated (the in-memory weight store hands them to the rollout
    # engine without a copy, so they must outlive the step). jit pairs donated inputs with
    # outputs of the same shape in output order, so the new parameters go last: the optimizer
    # moments and the reference weights then update their own buffers in place, where new
    # parameters listed first would take the moments' buffers and force a copy of each.
    def run(rest, params, x):
      state, metrics = fn(rest._replace(params=params), x, **kw, **opt)
      return state._replace(params=None), state.params, metrics
    out_sh = (sh._replace(params=None), sh.params, rep)
    jitted = jax.jit(run, out_shardings=out_sh, donate_argnums=d(0))

    def call(state, x):
      rest, params, metrics = jitted(state._replace(params=None), state.params, x)
      return rest._replace(params=params), metrics
    call.lower = lambda state, x: jitted.lower(state._replace(params=None), state.params, x)
    return call

  return TrainFns(
      step=jax.jit(_step, out_shardings=(sh, rep), donate_argnums=d(0)),
      init_accum=jax.jit(_init, out_shardings=acc_sh),
      accumulate=jax.jit(_acc, out_shardings=acc_sh, donate_argnums=d(1)),
      apply=_params_last(apply),
      fused_step=_params_last(functools.partial(fused_step, sampling=sampling)),
      shardings=sh, mesh=mesh, rules=rules)

"""The trainer state as one explicit pytree, its shardings, and its initialisation.

`TrainState(step, params, opt_state, ref_params, moe_state, rng, base)`:
  step: int32 `[]`, number of optimizer updates applied (= the policy version).
  params: the trained parameters: the model's (`models.init_params` layout) or, with LoRA
    (`ModelConfig.lora`), the adapters (`models.lora.init_lora` layout); sharded through the
    rules (FSDP over `data`, tensor parallel over `model`).
  opt_state: optax state; its parameter-shaped leaves share the parameters' shardings.
  ref_params: frozen reference copy for the KL term, or None when the KL coefficient is 0 or
    with LoRA (the reference is then the base itself).
  moe_state: MoE balancing state (`models.moe.init_moe_state`), or None for a dense model.
  rng: raw PRNG key uint32 `[2]` (the adapters' dropout draws from it).
  base: with LoRA, the frozen base parameters in their checkpoint dtype (never updated, never
    donated, not checkpointed: the checkpoint records `models.lora.base_digest`); else None.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_sys.models import ModelConfig, init_params, lora, param_axes
from jaxrl_sys.sharding import DEFAULT_RULES, Rules, tree_shardings
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.precision import cast_floating


class TrainState(NamedTuple):
  """Everything the train step reads and writes (see the module docstring)."""
  step: jax.Array
  params: Any
  opt_state: Any
  ref_params: Any
  moe_state: Any
  rng: jax.Array
  base: Any = None

  @property
  def policy(self) -> tuple[Any, Any]:
    """`(parameters, adapters)` of the policy: `(base, params)` with LoRA, else
    `(params, None)` (what `models.forward(params, ..., lora=adapters)` takes)."""
    return (self.params, None) if self.base is None else (self.base, self.params)


def init_moe_state(model_config: ModelConfig):
  """Initial MoE balancing state, or None for a dense model."""
  if model_config.moe is None:
    return None
  from jaxrl_sys.models.moe import block as moe  # pylint: disable=import-outside-toplevel
  return moe.init_moe_state(model_config)


def _build(model_config: ModelConfig, train_config: TrainConfig, optimizer, key, params=None):
  """The initial state; with LoRA its `base` is None (the caller places the base: it is never
  copied through a jitted program)."""
  pkey, rng = jax.random.split(key)
  rng = jax.random.key_data(rng) if _is_typed(rng) else rng
  if model_config.lora is not None:
    adapters = lora.init_lora(model_config, pkey)
    return TrainState(step=jnp.zeros([], jnp.int32), params=adapters,
                      opt_state=optimizer.init(adapters), ref_params=None,
                      moe_state=init_moe_state(model_config), rng=rng)
  if params is None:
    params = init_params(model_config, pkey)
  else:  # e.g. a bfloat16 checkpoint: the masters are kept in the configured param dtype
    params = cast_floating(params, model_config.param_dtype)
  ref = jax.tree.map(jnp.copy, params) if train_config.uses_reference else None
  return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                    opt_state=optimizer.init(params), ref_params=ref,
                    moe_state=init_moe_state(model_config), rng=rng)


def _is_typed(key) -> bool:
  return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


def abstract_state(model_config: ModelConfig, train_config: TrainConfig, optimizer) -> TrainState:
  """The state's shapes and dtypes (ShapeDtypeStructs, no shardings); no computation. With
  LoRA, `base` has the base's shapes in `model_config.param_dtype` (a base loaded in another
  dtype keeps it)."""
  abstract = jax.eval_shape(lambda k: _build(model_config, train_config, optimizer, k),
                            jax.random.PRNGKey(0))
  if model_config.lora is None:
    return abstract
  base = jax.eval_shape(lambda: init_params(lora.without_lora(model_config), jax.random.key(0)))
  return abstract._replace(base=base)


def state_shardings(abstract: TrainState, model_config: ModelConfig, optimizer,
                    mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES) -> TrainState:
  """NamedShardings for every leaf of the state on `mesh`.

  Parameters (and the reference copy) follow `param_axes` through `rules`; the optimizer's
  parameter-shaped leaves copy the parameters' shardings; everything else (step, counts, MoE
  balancing state, rng) is replicated.
  """
  replicated = NamedSharding(mesh, P())
  base_sh = None
  if model_config.lora is not None:
    p_sh = tree_shardings(abstract.params, lora.lora_axes(model_config), mesh, rules)
    base_sh = tree_shardings(abstract.base, param_axes(lora.without_lora(model_config)), mesh,
                             rules)
  else:
    p_sh = tree_shardings(abstract.params, param_axes(model_config), mesh, rules)
  opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, abstract.opt_state, p_sh,
                                 transform_non_params=lambda _: replicated)
  rep = lambda tree: jax.tree.map(lambda _: replicated, tree)
  return TrainState(step=replicated, params=p_sh, opt_state=opt_sh,
                    ref_params=None if abstract.ref_params is None else p_sh,
                    moe_state=rep(abstract.moe_state), rng=replicated, base=base_sh)


def with_shardings(abstract: TrainState, shardings: TrainState) -> TrainState:
  """ShapeDtypeStructs carrying `shardings` (a restore target on a possibly new mesh)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, shardings)


def place_base(base: Any, model_config: ModelConfig, mesh: jax.sharding.Mesh,
               rules: Rules = DEFAULT_RULES) -> Any:
  """The LoRA base on `mesh` by `param_axes`, in the dtype it comes in (its checkpoint's)."""
  config = lora.without_lora(model_config)
  return jax.device_put(base, tree_shardings(base, param_axes(config), mesh, rules))


def init_train_state(model_config: ModelConfig, train_config: TrainConfig, optimizer, *,
                     mesh: jax.sharding.Mesh, seed: int = 0, params: Any = None,
                     rules: Rules = DEFAULT_RULES) -> TrainState:
  """Builds the state directly in its sharded layout on `mesh`.

  Args:
    model_config: the model.
    train_config: decides whether a reference copy is kept.
    optimizer: from `make_optimizer`.
    mesh: the training mesh.
    seed: seeds the parameter init (when `params` is None) and the state's rng.
    params: optional initial parameters (e.g. after supervised warm-up or an HF import); with
      LoRA (`model_config.lora`) the frozen base, kept in its own dtype (default: a random
      base from the seed), and the adapters start fresh (B = 0).
    rules: logical-axis rules.

  Returns:
    A `TrainState` whose leaves are placed with `state_shardings`.
  """
  abstract = abstract_state(model_config, train_config, optimizer)
  shardings = state_shardings(abstract, model_config, optimizer, mesh, rules)
  key = jax.random.PRNGKey(seed)
  if model_config.lora is not None:
    if params is None:
      params = init_params(lora.without_lora(model_config), jax.random.fold_in(key, 1))
    base = place_base(params, model_config, mesh, rules)
    rest = shardings._replace(base=None)
    fn = jax.jit(lambda k: _build(model_config, train_config, optimizer, k), out_shardings=rest)
    return fn(key)._replace(base=base)
  if params is None:
    fn = jax.jit(lambda k: _build(model_config, train_config, optimizer, k),
                 out_shardings=shardings)
    return fn(key)
  params = jax.device_put(params, shardings.params)
  fn = jax.jit(lambda k, p: _build(model_config, train_config, optimizer, k, p),
               out_shardings=shardings, donate_argnums=())
  return fn(key, params)

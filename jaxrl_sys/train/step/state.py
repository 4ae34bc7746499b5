"""The trainer state as one explicit pytree, its shardings, and its initialisation.

`TrainState(step, params, opt_state, ref_params, moe_state, rng)`:
  step: int32 `[]`, number of optimizer updates applied (= the policy version).
  params: model parameters (`models.init_params` layout), sharded by `param_axes` through the
    rules (FSDP over `data`, tensor parallel over `model`).
  opt_state: optax state; its parameter-shaped leaves share the parameters' shardings.
  ref_params: frozen reference copy for the KL term, or None when the KL coefficient is 0.
  moe_state: MoE balancing state (`models.moe.init_moe_state`), or None for a dense model.
  rng: raw PRNG key uint32 `[2]`.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_sys.models import ModelConfig, init_params, param_axes
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


def init_moe_state(model_config: ModelConfig):
  """Initial MoE balancing state, or None for a dense model."""
  if model_config.moe is None:
    return None
  from jaxrl_sys.models.moe import block as moe  # pylint: disable=import-outside-toplevel
  return moe.init_moe_state(model_config)


def _build(model_config: ModelConfig, train_config: TrainConfig, optimizer, key, params=None):
  pkey, rng = jax.random.split(key)
  if params is None:
    params = init_params(model_config, pkey)
  else:  # e.g. a bfloat16 checkpoint: the masters are kept in the configured param dtype
    params = cast_floating(params, model_config.param_dtype)
  ref = jax.tree.map(jnp.copy, params) if train_config.uses_reference else None
  return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                    opt_state=optimizer.init(params), ref_params=ref,
                    moe_state=init_moe_state(model_config),
                    rng=jax.random.key_data(rng) if _is_typed(rng) else rng)


def _is_typed(key) -> bool:
  return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


def abstract_state(model_config: ModelConfig, train_config: TrainConfig, optimizer) -> TrainState:
  """The state's shapes and dtypes (ShapeDtypeStructs, no shardings); no computation."""
  return jax.eval_shape(lambda k: _build(model_config, train_config, optimizer, k),
                        jax.random.PRNGKey(0))


def state_shardings(abstract: TrainState, model_config: ModelConfig, optimizer,
                    mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES) -> TrainState:
  """NamedShardings for every leaf of the state on `mesh`.

  Parameters (and the reference copy) follow `param_axes` through `rules`; the optimizer's
  parameter-shaped leaves copy the parameters' shardings; everything else (step, counts, MoE
  balancing state, rng) is replicated.
  """
  replicated = NamedSharding(mesh, P())
  p_sh = tree_shardings(abstract.params, param_axes(model_config), mesh, rules)
  opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, abstract.opt_state, p_sh,
                                 transform_non_params=lambda _: replicated)
  rep = lambda tree: jax.tree.map(lambda _: replicated, tree)
  return TrainState(step=replicated, params=p_sh, opt_state=opt_sh,
                    ref_params=None if abstract.ref_params is None else p_sh,
                    moe_state=rep(abstract.moe_state), rng=replicated)


def with_shardings(abstract: TrainState, shardings: TrainState) -> TrainState:
  """ShapeDtypeStructs carrying `shardings` (a restore target on a possibly new mesh)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, shardings)


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
    params: optional initial parameters (e.g. after supervised warm-up or an HF import).
    rules: logical-axis rules.

  Returns:
    A `TrainState` whose leaves are placed with `state_shardings`.
  """
  abstract = abstract_state(model_config, train_config, optimizer)
  shardings = state_shardings(abstract, model_config, optimizer, mesh, rules)
  key = jax.random.PRNGKey(seed)
  if params is None:
    fn = jax.jit(lambda k: _build(model_config, train_config, optimizer, k),
                 out_shardings=shardings)
    return fn(key)
  params = jax.device_put(params, shardings.params)
  fn = jax.jit(lambda k, p: _build(model_config, train_config, optimizer, k, p),
               out_shardings=shardings, donate_argnums=())
  return fn(key, params)

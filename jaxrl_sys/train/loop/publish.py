"""The RL loop's weight publishing: a train state's weights as the rollout engines take them.

`publish` sends the parameters in the rollout dtype and the MoE state to the rollout session as
one version; `rollout_base` is a LoRA run's frozen base in the rollout dtype, published beside
the adapters (the loop casts it once per run). With a mesh spanning several processes, each
process publishes its local view, for its own engine.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_sys.models import lora
from jaxrl_sys.rollout.types import RolloutSession
from jaxrl_sys.rollout.weights import BaseWeights
from jaxrl_sys.train.multihost import collectives as multihost
from jaxrl_sys.train.precision import rollout_weights
from jaxrl_sys.train.step.state import TrainState


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _weights(state: TrainState, rollout_dtype: str, mesh=None):
  """The parameters in the rollout dtype (masters already in it go as they are: the train step
  does not donate them, so the in-memory store shares them with the engine) and a copy of the
  MoE state (donated). With `mesh` (one spanning several processes): this process's local view
  of both, for its own engine."""
  params, moe = rollout_weights(state.params, rollout_dtype), _copy(state.moe_state)
  return (params, moe) if mesh is None else multihost.localize((params, moe), mesh)


def publish(client: RolloutSession, state: TrainState, version: int, rollout_dtype: str,
            mesh=None, base: BaseWeights | None = None) -> int:
  """Publishes `state`'s parameters in `rollout_dtype` and its MoE state to `client` as
  `version` (`mesh`: one spanning several processes, this process's local view of both); with
  LoRA `base` names the frozen base (`rollout_base`). Returns the bytes of the version (the base
  excluded)."""
  params, moe = _weights(state, rollout_dtype, mesh)
  if base is None:
    client.publish(params, version, moe)
  else:
    client.publish(params, version, moe, base=base)
  return lora.nbytes((params, moe))


def rollout_base(base: Any, digest: str, rollout_dtype: str, mesh=None) -> BaseWeights:
  """LoRA: the frozen `base` (of `models.lora.base_digest` `digest`) as published to the
  engines: in `rollout_dtype`; with `mesh` (one spanning several processes) this process's
  local view."""
  arrays = rollout_weights(base, rollout_dtype)
  if mesh is not None:
    arrays = multihost.localize(arrays, mesh)
  return BaseWeights(digest, arrays)

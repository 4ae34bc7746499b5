"""The precision policy: which dtype each copy of the policy's numbers is held and computed in.

    masters + AdamW moments  param_dtype    (float32)   the state the optimizer updates
    forward / backward       compute_dtype  (auto)      the masters cast inside the jitted step
    rollout weights          rollout_dtype  (auto)      what is published to the engines
    gradient sums            accum_dtype    (float32)   micro-batch accumulation, clip, AdamW

With bfloat16 masters an AdamW update of a weight of size w below ~w * 2^-9 rounds away; at the
learning rates of RL post-training (1e-6 to 1e-5) that is almost every update, so the masters
stay float32 whatever the checkpoint's dtype. The compute copy is not stored: `forward` casts
each weight to the activations' dtype where it is used, so the gradient reaches the float32
master through the cast. "auto" resolves once, when the run is built: bfloat16 compute on a GPU
(sm80+) or TPU, float32 on a CPU (where bfloat16 matmuls are emulated and slower) and on a GPU
below sm80 (T4, V100: no bfloat16 tensor cores; `jaxrl_sys.backend`); the rollout follows
the compute dtype, so a bfloat16 publish moves half the bytes of a float32 one.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_sys import backend as backend_lib
from jaxrl_sys.models import ModelConfig

DTYPES = ("float32", "bfloat16")
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
  """Dtypes of the masters, the compute, the rollout copy and the gradient sums.

  Attributes:
    param_dtype: master parameters and the AdamW moments ("float32" or "bfloat16"; bfloat16
      masters lose small updates: use only to reproduce a low-memory run).
    compute_dtype: forward and backward of the train step; "auto" = bfloat16 on GPU (sm80+)
      and TPU, float32 on CPU and on GPUs below sm80 (T4, V100).
    rollout_dtype: the weights published to the rollout engines and their compute / KV-cache
      dtype; "auto" = the compute dtype.
    accum_dtype: gradient accumulation over micro-batches, clipping and the optimizer's input
      (float32 only: the gradient is never cast to the parameter dtype).
    export_dtype: dtype of the `--export_hf` tensors (None: float32, which keeps every update;
      bfloat16 halves the files but rounds most of a short RL run's update away: the run
      reports how much of it the export keeps, and warns below 90%).
  """
  param_dtype: str = "float32"
  compute_dtype: str = AUTO
  rollout_dtype: str = AUTO
  accum_dtype: str = "float32"
  export_dtype: str | None = None

  def __post_init__(self):
    for name, allowed in (("param_dtype", DTYPES), ("compute_dtype", DTYPES + (AUTO,)),
                          ("rollout_dtype", DTYPES + (AUTO,)), ("accum_dtype", ("float32",)),
                          ("export_dtype", DTYPES + (None,))):
      if getattr(self, name) not in allowed:
        raise ValueError(f"precision.{name}={getattr(self, name)!r}: use one of {list(allowed)}")

  def resolve(self, backend: str | None = None) -> "PrecisionConfig":
    """The policy with "auto" replaced for `backend` (a platform name; default: JAX's
    default backend), by `jaxrl_sys.backend.compute_dtype`."""
    compute = self.compute_dtype
    if compute == AUTO:
      compute = backend_lib.compute_dtype(backend)
    rollout = compute if self.rollout_dtype == AUTO else self.rollout_dtype
    return dataclasses.replace(self, compute_dtype=compute, rollout_dtype=rollout)

  @property
  def resolved(self) -> bool:
    return AUTO not in (self.compute_dtype, self.rollout_dtype)

  def _need_resolved(self) -> None:
    if not self.resolved:
      raise ValueError(f"{self} still has 'auto' dtypes: call .resolve() first")

  def train_model(self, config: ModelConfig) -> ModelConfig:
    """`config` with float32/bfloat16 masters and compute as this policy says."""
    self._need_resolved()
    return dataclasses.replace(config, param_dtype=self.param_dtype,
                               compute_dtype=self.compute_dtype)

  def rollout_model(self, config: ModelConfig) -> ModelConfig:
    """`config` as the rollout engines run it: weights, compute and KV cache in rollout_dtype."""
    self._need_resolved()
    return dataclasses.replace(config, param_dtype=self.rollout_dtype,
                               compute_dtype=self.rollout_dtype)

  def describe(self) -> str:
    """One line for the startup log, e.g. "masters float32, compute bfloat16, ..."."""
    return (f"precision: masters + moments {self.param_dtype}, compute {self.compute_dtype}, "
            f"rollout {self.rollout_dtype}, gradient sums {self.accum_dtype}")

  @staticmethod
  def of_model(config: ModelConfig) -> "PrecisionConfig":
    """The policy a `ModelConfig` already implies (rollout in its compute dtype)."""
    return PrecisionConfig(param_dtype=config.param_dtype, compute_dtype=config.compute_dtype,
                           rollout_dtype=config.compute_dtype)


def cast_floating(tree: Any, dtype: str) -> Any:
  """Every floating leaf of `tree` as `dtype` (other leaves and leaves already of it as they
  are, the same arrays). Works on jax arrays (device-side cast) and numpy arrays."""
  want = jnp.dtype(dtype)

  def one(x):
    if not hasattr(x, "dtype") or not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == want:
      return x
    return x.astype(want)
  return jax.tree.map(one, tree)


_cast_jit = jax.jit(cast_floating, static_argnums=1)


def rollout_weights(params: Any, rollout_dtype: str) -> Any:
  """The masters as the rollout engines get them: `params` itself when it already is in
  `rollout_dtype` (the in-memory store then shares the arrays), else one jitted cast that keeps
  each leaf's sharding (a bfloat16 copy: half the bytes of float32 masters)."""
  want = jnp.dtype(rollout_dtype)
  if all(x.dtype == want for x in jax.tree.leaves(params)
         if jnp.issubdtype(x.dtype, jnp.floating)):
    return params
  return _cast_jit(params, rollout_dtype)

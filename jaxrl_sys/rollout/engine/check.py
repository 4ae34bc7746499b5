"""Checks published weights against the model before an engine serves them, and requests
against an engine's context (`check_request`).

A wrong tree (missing or extra parameters), a wrong shape or a non-float dtype would otherwise
surface as a raw `KeyError` / shape error deep in the model code, or worse, generate tokens from
integer weights with log-probability 0. `check_weights` names every mismatching parameter path.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_sys.models.config import ModelConfig
from jaxrl_sys.rollout.engine.config import EngineConfig
from jaxrl_sys.models.transformer import init_params

_SHOW = 8  # mismatches listed per kind


class WeightMismatchError(ValueError):
  """Published parameters do not fit the model (tree, shapes or dtypes)."""


@functools.lru_cache(maxsize=16)
def _expected(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  return {jax.tree_util.keystr(p): tuple(x.shape)
          for p, x in jax.tree_util.tree_flatten_with_path(shapes)[0]}


def _dtype(x: Any) -> np.dtype:
  return np.dtype(getattr(x, "dtype", None) or np.asarray(x).dtype)


def _listed(items: list[str]) -> str:
  more = f", ... ({len(items) - _SHOW} more)" if len(items) > _SHOW else ""
  return ", ".join(items[:_SHOW]) + more


def check_weights(config: ModelConfig, params: Any, version: int | None = None) -> None:
  """Raises `WeightMismatchError` unless `params` has exactly the model's parameter tree, each
  leaf with the model's shape and a floating-point dtype.

  Args:
    config: the model the engine runs.
    params: the published parameter pytree (host or device arrays, any float dtype).
    version: the weight version, for the message.
  """
  want = _expected(config)
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  got = {jax.tree_util.keystr(p): x for p, x in leaves}
  missing = sorted(set(want) - set(got))
  extra = sorted(set(got) - set(want))
  shapes = [f"{k} {tuple(np.shape(got[k]))} (model: {want[k]})" for k in sorted(want)
            if k in got and tuple(np.shape(got[k])) != want[k]]
  dtypes = [f"{k} {_dtype(got[k])}" for k in sorted(got)
            if k in want and not jnp.issubdtype(_dtype(got[k]), jnp.floating)]
  if not (missing or extra or shapes or dtypes):
    return
  what = [f"missing: {_listed(missing)}" if missing else "",
          f"not in the model: {_listed(extra)}" if extra else "",
          f"wrong shape: {_listed(shapes)}" if shapes else "",
          f"not floating point (log-probs would be meaningless): {_listed(dtypes)}"
          if dtypes else ""]
  name = "the published weights" if version is None else f"the weights of version {version}"
  raise WeightMismatchError(
      f"{name} do not fit the model ({config.num_layers} layers, hidden {config.hidden_size}, "
      f"vocab {config.vocab_size}): " + "; ".join(w for w in what if w) +
      ". Publish parameters built for this model config (e.g. from init_params or the "
      "checkpoint of the same model), in a float dtype")


def check_request(r: Any, model_config: ModelConfig, config: EngineConfig) -> None:
  """Raises ValueError naming the problem unless request `r` (`rollout.types.Request`) fits the
  engine: its context (`max_len`), a positive budget, token ids in the vocabulary, and a
  prefill that fits the largest prefill bucket."""
  total = len(r.prompt) + r.max_new_tokens
  if total > config.max_len:
    raise ValueError(
        f"request {r.request_id}: prompt longer than the context: prompt length "
        f"{len(r.prompt)} + max_new_tokens {r.max_new_tokens} = {total} > engine max_len "
        f"{config.max_len}")
  if r.max_new_tokens <= 0:
    raise ValueError(f"request {r.request_id}: max_new_tokens must be > 0")
  seq = np.concatenate([r.prompt, r.tokens])
  if seq.min() < 0 or seq.max() >= model_config.vocab_size:
    raise ValueError(f"request {r.request_id}: token ids outside [0, vocab_size="
                     f"{model_config.vocab_size})")
  if len(seq) - 1 > config.prefill_buckets[-1]:
    raise ValueError(f"request {r.request_id}: prefill length {len(seq) - 1} exceeds the "
                     f"largest prefill bucket {config.prefill_buckets[-1]}")

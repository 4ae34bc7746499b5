"""The train step's programs for one configuration, built once per process.

`train_programs(model_config, train_config, moment_dtype, mesh, rules, sampling)` gives the
optimizer,
the learning-rate schedule, the abstract state and the jitted step pieces (`update.TrainFns`).
A second loop built with equal arguments in the same process (a notebook cell run again, an
evaluation loop beside a training loop, a test suite) gets the same jitted functions back, so
their traces and compiled executables are reused: nothing is traced, lowered or compiled again.
This is sound because every argument is a value (frozen dataclasses, a dtype name, a `Mesh`,
a tuple of rules) and the optimizer and the schedule are pure functions of them; arguments
that are not hashable (rules given as a list) build the programs anew, uncached.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import optax

from jaxrl_sys.models import ModelConfig, SamplingConfig
from jaxrl_sys.sharding import DEFAULT_RULES, Rules
from jaxrl_sys.train.step.config import TrainConfig
from jaxrl_sys.train.step.optim import make_optimizer, make_schedule
from jaxrl_sys.train.step.state import TrainState, abstract_state
from jaxrl_sys.train.step.update import SAMPLING, TrainFns, make_train_fns

# Distinct configurations whose programs a process keeps (each holds its compiled executables).
CACHED_CONFIGS = 8


class TrainPrograms(NamedTuple):
  """What a loop needs to train one configuration on one mesh.

  optimizer: `optim.make_optimizer(train_config.optim, ...)`, moments in `moment_dtype`.
  schedule: the learning rate by step (`optim.make_schedule`).
  abstract: the state's shapes and dtypes (`state.abstract_state`).
  fns: the jitted step pieces on `mesh` (`update.make_train_fns`, buffers donated).
  """
  optimizer: optax.GradientTransformationExtraArgs
  schedule: Callable[[Any], Any]
  abstract: TrainState
  fns: TrainFns


def _build(model_config: ModelConfig, train_config: TrainConfig, moment_dtype: str | None,
           mesh: jax.sharding.Mesh, rules: Rules, sampling: SamplingConfig) -> TrainPrograms:
  optimizer = make_optimizer(train_config.optim, ess_rule=train_config.ess_rule,
                             base_ess_ratio=train_config.base_ess_ratio,
                             moment_dtype=moment_dtype)
  schedule = make_schedule(train_config.optim)
  abstract = abstract_state(model_config, train_config, optimizer)
  fns = make_train_fns(model_config, train_config, optimizer, abstract, mesh, rules=rules,
                       schedule=schedule, sampling=sampling)
  return TrainPrograms(optimizer, schedule, abstract, fns)


_cached = functools.lru_cache(maxsize=CACHED_CONFIGS)(_build)


def train_programs(model_config: ModelConfig, train_config: TrainConfig,
                   moment_dtype: str | None, mesh: jax.sharding.Mesh,
                   rules: Rules = DEFAULT_RULES,
                   sampling: SamplingConfig = SAMPLING) -> TrainPrograms:
  """The optimizer, schedule, abstract state and jitted step pieces for these arguments (the
  step's log-probs at `sampling.temperature`, the rollout's); the same objects for equal
  arguments within a process (see the module docstring)."""
  args = (model_config, train_config, moment_dtype, mesh, rules, sampling)
  try:
    hash(args)
  except TypeError:
    return _build(*args)
  return _cached(*args)

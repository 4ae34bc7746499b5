"""Faster compilation for the losses tests.

The tests compile a few dozen tiny programs whose run time is negligible, so XLA's optimisation
passes are pure cost here; they are switched off for this package only and restored after.
"""
import jax
import pytest


@pytest.fixture(scope="package", autouse=True)
def _fast_compilation():
  previous = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)

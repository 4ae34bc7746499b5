"""Fixtures for the kernel tests (tiny shapes: Pallas runs in interpret mode on CPU)."""
import jax
import pytest


@pytest.fixture
def keys():
  return jax.random.split(jax.random.key(0), 8)

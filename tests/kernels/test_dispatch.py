"""The kernels' Pallas helpers: interpret mode by backend, block sizes (the implementation
choice itself is `jaxrl_sys.backend`'s: tests/test_backend.py)."""
import jax
import pytest

from jaxrl_sys.kernels import dispatch


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=(
    "asserts the CPU's choice (Pallas in interpret mode); "
    "tests/test_backend.py checks every backend's"))
def test_interpret_mode_on_cpu():
  assert dispatch.default_interpret()
  assert dispatch.resolve_interpret(None) and not dispatch.resolve_interpret(False)


@pytest.mark.parametrize("req,extent,expected", [(64, 37, 64), (64, 300, 64), (128, 5, 16),
                                                 (100, 1000, 128)])
def test_block_size_power_of_two(req, extent, expected):
  assert dispatch.block_size(req, extent) == expected

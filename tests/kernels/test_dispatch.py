"""Backend selection."""
import jax
import pytest

from jaxrl_sys.kernels import dispatch


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=(
    "asserts the CPU's choices (XLA for 'auto', Pallas in interpret mode); "
    "tests/test_backend.py checks every backend's"))
def test_resolve_impl_on_cpu():
  assert dispatch.resolve_impl("auto") == "xla"
  assert dispatch.resolve_impl("pallas") == "pallas"
  assert dispatch.resolve_impl("xla") == "xla"
  assert dispatch.default_interpret()
  assert dispatch.resolve_interpret(None) and not dispatch.resolve_interpret(False)


def test_resolve_impl_rejects_unknown():
  with pytest.raises(ValueError, match="impl"):
    dispatch.resolve_impl("triton")


@pytest.mark.parametrize("req,extent,expected", [(64, 37, 64), (64, 300, 64), (128, 5, 16),
                                                 (100, 1000, 128)])
def test_block_size_power_of_two(req, extent, expected):
  assert dispatch.block_size(req, extent) == expected

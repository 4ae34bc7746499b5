"""The backend-aware test helpers (tests/precision_helpers.py) decide as documented."""
import jax

from tests.precision_helpers import (float32_tolerance, highest_precision, matmul_precision,
                                     per_backend)


def test_tolerance_follows_the_matmul_precision_in_force():
  assert matmul_precision("cpu") == "highest" and float32_tolerance("cpu") == 1e-5
  with jax.default_matmul_precision("default"):
    assert matmul_precision("gpu") == "tf32" and float32_tolerance("gpu") == 2e-3
    assert matmul_precision("tpu") == "bf16_passes" and float32_tolerance("tpu") == 2e-2
  with highest_precision():
    assert matmul_precision("gpu") == matmul_precision("tpu") == "highest"


def test_per_backend_expectations():
  assert per_backend(cpu="segments", gpu="ragged", backend="cpu") == "segments"
  assert per_backend(cpu="segments", gpu="ragged", backend="gpu") == "ragged"
  assert per_backend(cpu="segments", gpu="ragged", backend="tpu") == "ragged"
  assert per_backend(cpu="xla", backend="gpu") == "xla"

"""Backend-aware test helpers, stated once: float32 tolerances from the backend's default matmul
precision, references at HIGHEST precision, device-count skips, per-backend expectations.

On a CPU a float32 matmul is a float32 matmul. On a GPU, JAX's default precision runs float32
matmuls as TF32 (10-bit mantissa, relative error ~1e-3), and on a TPU as bfloat16 passes
(8-bit mantissa, ~1e-2 after accumulation), so a comparison at 1e-5 fails there although
nothing is wrong. `JAX_DEFAULT_MATMUL_PRECISION=highest` (or `jax.default_matmul_precision`)
restores full float32 everywhere; `float32_tolerance()` reads which one is in force.
"""
from __future__ import annotations

import contextlib

import jax
import pytest

# Relative tolerance of a float32 result per effective matmul precision.
_TOLERANCE = {"highest": 1e-5, "tf32": 2e-3, "bf16_passes": 2e-2}


def matmul_precision(backend: str | None = None) -> str:
  """"highest", "tf32" or "bf16_passes": what a default-precision float32 matmul really does on
  `backend` (default: JAX's default backend), given `jax_default_matmul_precision`."""
  backend = backend or jax.default_backend()
  setting = str(jax.config.jax_default_matmul_precision or "default").lower()
  if backend == "cpu" or setting in ("highest", "float32", "precision.highest"):
    return "highest"
  if backend == "tpu" and setting in ("default", "bfloat16", "precision.default"):
    return "bf16_passes"
  return "tf32"


def float32_tolerance(backend: str | None = None) -> float:
  """The relative (and, scaled by the magnitude, absolute) tolerance for comparing float32
  results that went through matmuls: 1e-5 at full precision, looser under TF32 / bf16 passes."""
  return _TOLERANCE[matmul_precision(backend)]


@contextlib.contextmanager
def highest_precision():
  """Full float32 matmuls inside the block, on every backend (for references)."""
  with jax.default_matmul_precision("highest"):
    yield


def configure_for_backend(platforms: str) -> None:
  """Full float32 matmuls for the whole session when it runs on an accelerator
  (`JAX_PLATFORMS` other than "cpu") and the user did not choose a precision: the suite checks
  float32 numerics against float32 references. Called by tests/conftest.py before any test."""
  import os  # pylint: disable=import-outside-toplevel
  if platforms != "cpu" and not os.environ.get("JAX_DEFAULT_MATMUL_PRECISION"):
    jax.config.update("jax_default_matmul_precision", "highest")


def needs_devices(n: int):
  """Marks a test that builds an `n`-device mesh: skipped, saying why, when fewer exist (the CPU
  suite fakes 8 with `--xla_force_host_platform_device_count`; one GPU has 1)."""
  have = jax.device_count()
  return pytest.mark.skipif(have < n, reason=f"needs {n} devices, {have} "
                            f"{jax.default_backend()} device(s) present")


def per_backend(*, cpu, gpu=None, tpu=None, backend: str | None = None):
  """The expected value on this backend (e.g. which implementation "auto" picks); `gpu`
  defaults to `tpu`'s and vice versa, both to `cpu`'s."""
  backend = backend or jax.default_backend()
  accel = gpu if gpu is not None else tpu
  table = {"cpu": cpu, "gpu": accel if accel is not None else cpu,
           "cuda": accel if accel is not None else cpu,
           "tpu": tpu if tpu is not None else (accel if accel is not None else cpu)}
  return table.get(backend, cpu)

"""Test-session set-up: 8 fake CPU devices, the persistent compilation cache, and LLVM's
lowest optimisation level for XLA:CPU code (`--xla_backend_optimization_level=0`: the suite is
mostly compilation on a fresh clone, and this cuts its cold run from about 580 s to 480 s on 2
cores; the compiled code runs a little slower and agrees with the default level to float32
rounding, not bit for bit: the suite's bit-exact checks compare runs made under the same flags).
Subprocesses, notebook kernels and Ray workers inherit the flags.

Both must be configured before JAX initialises its backend, so this file does it at import.
"""
import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

from tests.precision_helpers import configure_for_backend  # noqa: E402

configure_for_backend(os.environ["JAX_PLATFORMS"])


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Keeps each test file on one xdist worker (`--dist loadgroup`), as `loadfile` would, while
  files marked `xdist_group("ray")` share one worker and so one Ray instance."""
  for item in items:
    if item.get_closest_marker("xdist_group") is None:
      item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def ray_session():
  """One local Ray instance for the whole session (workers inherit this process's XLA flags);
  test files using it are marked `pytestmark = pytest.mark.xdist_group("ray")`."""
  from jaxrl_sys.rollout.workers.ray import import_ray, init_ray  # pylint: disable=import-outside-toplevel
  ray = import_ray()
  init_ray(num_cpus=16, object_store_memory=256 * 2**20)
  yield ray
  ray.shutdown()


RAY_COMPILE_CACHE = str(_CACHE)

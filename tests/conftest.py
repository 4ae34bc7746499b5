"""Test-session set-up: 8 fake CPU devices, the persistent compilation cache, and LLVM's
lowest optimisation level for XLA:CPU code (`--xla_backend_optimization_level=0`: the suite is
mostly compilation on a fresh clone, and this cuts its cold run from about 580 s to 480 s on 2
cores; the compiled code runs a little slower and agrees with the default level to float32
rounding, not bit for bit: the suite's bit-exact checks compare runs made under the same flags),
and single-threaded Eigen ops (`--xla_cpu_multi_thread_eigen=false`: two xdist workers and their
subprocesses already fill 2 cores, and the tiny models' ops gain nothing from a thread pool that
spins; measured 10% less CPU on the step, MoE and CLI tests, cold), and XLA:CPU's elemental
emitters instead of its fusion emitters (`--xla_cpu_use_fusion_emitters=false`: the first,
cold run of the tests' tiny GRPO recipe compiles in 7.7 CPU-s instead of 15.4, and its later
runs take the same time).
Subprocesses, notebook kernels and Ray workers inherit the flags.

All must be configured before JAX initialises its backend, so this file does it at import.
"""
import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _jaxlib_version() -> str:
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  try:
    return metadata.version("jaxlib")
  except metadata.PackageNotFoundError:
    return ""


if os.environ["JAX_PLATFORMS"] == "cpu":
  _FLAGS = ["--xla_backend_optimization_level=0", "--xla_cpu_multi_thread_eigen=false"]
  # XLA aborts on a flag it does not know, and the legacy emitters may leave a later XLA: this
  # one is set only for the pinned jaxlib (0.10.x), where it was measured.
  if _jaxlib_version().startswith("0.10."):
    _FLAGS.append("--xla_cpu_use_fusion_emitters=false")
  for _flag in _FLAGS:
    if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
      os.environ["XLA_FLAGS"] += " " + _flag
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray starts idle Python workers when a driver connects; the suite's actors never use them (they
# start workers of their own), and each costs ~1-2 CPU-s: 11 per run, measured. Off for the
# suite's Ray instances (the session's and those its commands start).
os.environ.setdefault("RAY_prestart_worker_first_driver", "false")

import jax  # noqa: E402

_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

from tests.precision_helpers import configure_for_backend  # noqa: E402

configure_for_backend(os.environ["JAX_PLATFORMS"])


import pytest  # noqa: E402

from tests import scheduling  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Puts the longest units of work first (`tests.scheduling.sort_heavy_first`)."""
  scheduling.sort_heavy_first(items)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """`--dist loadgroup`: one worker per test file, or per shared group of files
  (`tests.scheduling`), whatever the pytest version."""
  if config.getvalue("dist") != "loadgroup":
    return None
  return scheduling.make_scheduler(config, log)


_RAY = []  # the Ray module while the session's instance runs


@pytest.fixture(scope="session")
def ray_session():
  """One local Ray instance for the tests of the "ray" unit of work (`tests.scheduling`), all
  on one worker: started by the first test that asks for it, shut down after the unit's last
  test (`pytest_runtest_teardown`), not kept idle to the end of the run. Ray workers inherit
  this process's XLA flags."""
  if not _RAY:
    from jaxrl_sys.rollout.workers.ray import import_ray, init_ray  # pylint: disable=import-outside-toplevel
    ray = import_ray()
    init_ray(num_cpus=16, object_store_memory=256 * 2**20)
    _RAY.append(ray)
  return _RAY[0]


def _stop_ray() -> None:
  if _RAY:
    _RAY.pop()
    from jaxrl_sys.rollout.workers.ray import shutdown_ray  # pylint: disable=import-outside-toplevel
    shutdown_ray()  # also a local head a run started in its own session


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
  """Shuts the session's Ray instance down once the next test belongs to another unit of work
  (an idle instance costs ~3% of a core)."""
  if _RAY and (nextitem is None
               or scheduling.group_of(nextitem.nodeid) != scheduling.group_of(item.nodeid)):
    _stop_ray()


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  _stop_ray()


RAY_COMPILE_CACHE = str(_CACHE)

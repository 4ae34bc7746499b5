"""Start-up settings, cluster detection and the liveness watchdog (no JAX job: the watchdog
runs on an in-memory key-value store with an injected clock)."""
import pytest

from experiments import grpo
from jaxrl_sys.train.multihost import job
from jaxrl_sys.train.multihost.job import DistributedConfig, Watchdog, parse_device_ids
from jaxrl_sys.train.recipe import RecipeConfig, config_file
from jaxrl_sys.train.recipe.run_config import RunConfig

SLURM = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "gpu[01-04]", "SLURM_NTASKS": "4",
         "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}


def test_config_defaults_are_single_process_and_bad_values_are_named():
  assert not DistributedConfig().explicit
  assert DistributedConfig(num_processes=2, process_id=1, coordinator_address="h:1").explicit
  with pytest.raises(ValueError, match="distributed.process_id=2 must lie in"):
    DistributedConfig(num_processes=2, process_id=2, coordinator_address="h:1")
  with pytest.raises(ValueError, match="needs distributed.coordinator_address"):
    DistributedConfig(num_processes=2, process_id=0)
  with pytest.raises(ValueError, match="distributed.timeout=0"):
    DistributedConfig(timeout=0)
  assert parse_device_ids("0, 1,2") == (0, 1, 2) and parse_device_ids(None) is None
  with pytest.raises(ValueError, match="distributed.local_device_ids='a'"):
    parse_device_ids("a")
  with pytest.raises(ValueError, match="distributed.local_device_ids='0,x'"):
    DistributedConfig(local_device_ids="0,x")
  rc = RecipeConfig(mesh="2x4", num_processes=2, process_id=1, coordinator_address="h:1",
                    local_device_ids="3", distributed_timeout=9)
  got = rc.run_config().distributed
  assert got == DistributedConfig("2x4", "h:1", 2, 1, "3", 9.0) and got.device_ids == (3,)


def test_placement_settings_are_flags_of_the_tree_but_not_in_config_json():
  """The five placement settings are the tree's `distributed` section (one class), reachable
  by their short names; config.json keeps the mesh and drops the placement, so the run
  written by 2 processes is the run of 1."""
  assert RunConfig.__dataclass_fields__["distributed"].type in ("DistributedConfig",
                                                                  DistributedConfig)
  rc = RunConfig().replace(mesh="2x4", coordinator_address="h:1", num_processes=2,
                           process_id=0, local_device_ids="0", distributed_timeout=30)
  assert isinstance(rc.distributed, DistributedConfig) and rc.distributed.timeout == 30
  assert rc.get("distributed_timeout") == 30 and rc.distributed.num_processes == 2
  written = config_file.reproducible(rc)
  assert written["distributed"] == {"mesh": "2x4"}
  assert written == config_file.reproducible(RunConfig().replace(mesh="2x4"))


def test_slurm_is_detected_and_supplies_the_process_count(monkeypatch):
  for k in SLURM:
    monkeypatch.delenv(k, raising=False)
  assert job.detect_cluster() is None
  assert job.planned_process_count(DistributedConfig()) == 1
  for k, v in SLURM.items():
    monkeypatch.setenv(k, v)
  assert job.detect_cluster() == ("slurm", 4)
  assert job.planned_process_count(DistributedConfig()) == 4
  DistributedConfig(num_processes=4)  # the environment supplies the rest


def test_each_process_fakes_its_share_of_the_mesh(monkeypatch):
  for k in SLURM:
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("XLA_FLAGS", "")
  grpo._fake_cpu_devices(["grpo", "--mesh=2x4", "--num_processes=2"])
  assert "--xla_force_host_platform_device_count=4" in __import__("os").environ["XLA_FLAGS"]
  monkeypatch.setenv("XLA_FLAGS", "")
  grpo._fake_cpu_devices(["grpo", "--mesh=2x4"])
  assert "--xla_force_host_platform_device_count=8" in __import__("os").environ["XLA_FLAGS"]
  monkeypatch.setenv("XLA_FLAGS", "")  # the generated (dotted) names work too
  grpo._fake_cpu_devices(["grpo", "--distributed.mesh", "4x2", "--distributed.num_processes=4"])
  assert "--xla_force_host_platform_device_count=2" in __import__("os").environ["XLA_FLAGS"]


def test_a_config_file_places_the_processes_too(monkeypatch, tmp_path):
  for k in SLURM:
    monkeypatch.delenv(k, raising=False)
  path = tmp_path / "job.yaml"
  path.write_text("distributed:\n  mesh: 2x4\n  num_processes: 2\n")
  monkeypatch.setenv("XLA_FLAGS", "")
  grpo._fake_cpu_devices(["grpo", f"--config={path}"])
  assert "--xla_force_host_platform_device_count=4" in __import__("os").environ["XLA_FLAGS"]


class _Store:
  """The coordination service's key-value calls, in memory; `down` makes them fail."""

  def __init__(self):
    self.data, self.down = {}, False

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.down:
      raise RuntimeError("UNAVAILABLE: failed to connect to the coordination service")
    assert allow_overwrite or key not in self.data
    self.data[key] = value

  def key_value_try_get(self, key):
    if self.down:
      raise RuntimeError("UNAVAILABLE: failed to connect to the coordination service")
    if key not in self.data:
      raise RuntimeError(f"NOT_FOUND: {key}")
    return self.data[key]


class _Clock:
  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


def _dogs(count=3, timeout=10.0):
  store, clock, lost = _Store(), _Clock(), []
  dogs = [Watchdog(i, count, timeout, client=store, clock=clock,
                   on_lost=lambda m, i=i: lost.append((i, m))) for i in range(count)]
  return store, clock, lost, dogs


def test_a_silent_process_is_named_after_half_the_timeout():
  store, clock, lost, dogs = _dogs()
  for t in range(0, 5):  # every process beats every second
    clock.t = float(t)
    assert [d.tick() for d in dogs] == [None] * 3
  for t in range(5, 12):  # process 2 goes silent after t = 4 (last seen at t = 5)
    clock.t = float(t)
    dogs[0].tick()
    dogs[1].tick()
  assert [i for i, _ in lost] == [0, 1]
  assert all("lost process 2 of 3" in m and "--resume" in m for _, m in lost)
  assert dogs[0].lost() == lost[0][1]


def test_a_finished_process_is_not_lost_and_a_failed_one_ends_the_others():
  store, clock, lost, dogs = _dogs(count=2)
  for d in dogs:
    d.tick()
  dogs[1].finish()
  for t in range(1, 20):
    clock.t = float(t)
    assert dogs[0].tick() is None
  assert lost == []
  store, clock, lost, dogs = _dogs(count=2)
  dogs[0].tick()
  dogs[1].finish(error="ValueError: bad --task")
  assert "process 1 of 2 failed: ValueError: bad --task" in dogs[0].tick()


def test_an_unreachable_coordinator_is_named():
  store, clock, lost, dogs = _dogs(count=2)
  dogs[1].tick()
  store.down = True
  assert "lost the coordinator (process 0 of 2)" in dogs[1].tick()
  assert len(lost) == 1


def test_an_infinite_timeout_or_a_portless_coordinator_is_named():
  """Issue 44: `--distributed_timeout=inf` was accepted (a lost process was never named), and
  --coordinator_address without a port failed with "IndexError" once the job started."""
  for t in (float("inf"), float("nan"), -1.0):
    with pytest.raises(ValueError, match=r"distributed.timeout=.* must be a finite number of "
                                         "seconds > 0"):
      DistributedConfig(timeout=t)
  for address in ("localhost", "h:", "h:0", "h:70000", "h:x1"):
    with pytest.raises(ValueError, match=r"coordinator_address=.*expected HOST:PORT"):
      DistributedConfig(num_processes=2, process_id=0, coordinator_address=address)
  assert job.coordinator_host_port("[::1]:1234") == ("::1", 1234)

"""The suite's units of work (`tests.scheduling`): files, or shared groups of files."""
import pathlib

import pytest

from tests import scheduling

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_listed_file_exists():
  listed = [f for files in scheduling.SHARED_GROUPS.values() for f in files]
  listed += [g for g in scheduling.HEAVY_GROUPS if g not in scheduling.SHARED_GROUPS]
  missing = [f for f in listed if not (ROOT / f).is_file()]
  assert not missing, f"tests/scheduling.py names files that do not exist: {missing}"


@pytest.mark.parametrize("nodeid,unit", [
    ("tests/losses/test_policy.py::test_a[x-1]", "tests/losses/test_policy.py"),
    ("tests/losses/test_policy.py::TestC::test_b", "tests/losses/test_policy.py"),
    ("tests/train/loop/test_elastic_loop.py::test_a[p@q]", "ray"),
    ("tests/experiments/test_grpo_ray_cli.py::test_b@ray-cli", "ray"),
    ("tests/experiments/test_grpo_cli.py::test_c", "tests/experiments/test_grpo_cli.py"),
])
def test_group_of(nodeid, unit):
  assert scheduling.group_of(nodeid) == unit


class _Item:
  def __init__(self, nodeid):
    self.nodeid = nodeid


def test_heavy_units_first_longest_first_then_collection_order():
  ids = ["tests/a.py::t1", "tests/models/test_moe.py::t", "tests/b.py::t",
         "tests/rollout/workers/test_ray_elastic.py::t", "tests/a.py::t2",
         "tests/experiments/test_grpo_cli.py::t"]
  items = [_Item(i) for i in ids]
  scheduling.sort_heavy_first(items)
  assert [i.nodeid for i in items] == [
      "tests/rollout/workers/test_ray_elastic.py::t",      # ray: 330
      "tests/experiments/test_grpo_cli.py::t",             # 150
      "tests/models/test_moe.py::t",                       # 55
      "tests/a.py::t1", "tests/b.py::t", "tests/a.py::t2"]

"""How the suite's tests are spread over the xdist workers (`pytest -n 2 --dist loadgroup`).

A unit of work is a test file, as `--dist loadfile` would make it, except that the files of a
`SHARED_GROUPS` entry go to one worker together: "ray" holds every file that uses Ray (the
session's instance, `ray_session`, or a command or notebook that starts or joins one), so that
one worker starts the session's instance, and two Ray instances of commands never run at once.
The `HEAVY_GROUPS` are scheduled first, longest first, so that the run never ends on one worker
still in a long unit while the other is idle (`--no-loadscope-reorder` keeps this order).

The units are computed here from the node id alone, by `GroupScheduling` in the controller.
xdist's own `loadgroup` reads `xdist_group` marks in the workers and passes them to the
controller by appending `@group` to each node id; since pytest 9.2 that rewrite no longer takes
effect (pytest-dev/pytest-xdist#1386) and every test was scheduled alone: the Ray tests were
split over both workers, each starting a Ray instance, and module fixtures ran twice.
"""
from __future__ import annotations

SHARED_GROUPS = {
    "ray": ("tests/rollout/weights/test_ray_weights.py",
            "tests/rollout/manager/test_client_contract.py",
            "tests/rollout/workers/test_ray_elastic.py",
            "tests/train/loop/test_offload_loop.py",
            "tests/train/loop/test_elastic_loop.py",
            "tests/notebooks/test_notebook_elastic.py",
            "tests/experiments/test_grpo_ray_cli.py",
            "tests/agents/test_ray_episodes.py"),
}

# The longest units, in seconds of one worker (2 cores, a cold compile cache, measured
# 2026-11-26; "ray" 2026-11-27). Only the order depends on these figures.
HEAVY_GROUPS = {
    "ray": 330,
    "tests/experiments/test_grpo_cli.py": 150, "tests/harness/test_cli_harness.py": 130,
    "tests/train/loop/test_multihost.py": 110, "tests/notebooks/test_notebooks.py": 80,
    "tests/docs/test_doc_runs.py": 80, "tests/train/step/test_step.py": 60,
    "tests/models/test_moe_segments.py": 60, "tests/models/test_moe.py": 55,
    "tests/models/test_hf_parity.py": 55,
}

_GROUP_OF_FILE = {f: g for g, files in SHARED_GROUPS.items() for f in files}


def group_of(nodeid: str) -> str:
  """The unit of work of a test: its shared group's name, else its file (the node id's part
  before the first `::`, with any `@suffix` an older xdist appended dropped)."""
  path = nodeid.split("::", 1)[0].split("@", 1)[0]
  return _GROUP_OF_FILE.get(path, path)


def sort_heavy_first(items: list) -> None:
  """Sorts collected pytest items in place: `HEAVY_GROUPS` first, longest first, then the rest
  in collection order (the sort is stable)."""
  rank = {g: i for i, g in enumerate(sorted(HEAVY_GROUPS, key=lambda g: -HEAVY_GROUPS[g]))}
  items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))


def make_scheduler(config, log):
  """xdist's scheduler for `--dist loadgroup` with the units of `group_of` (None without
  xdist's load-scope scheduler, e.g. an xdist too old or too new to have it)."""
  try:
    from xdist.scheduler.loadscope import LoadScopeScheduling  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None

  class GroupScheduling(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
      return group_of(nodeid)

  return GroupScheduling(config, log)

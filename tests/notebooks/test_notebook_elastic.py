"""Notebook 4 (elastic rollout on local Ray workers), executed headless on CPU in small mode.

The kernel is its own process: it starts its own local Ray instance (never the session's
`ray_session`, which may be alive in this xdist worker) and shuts it down in its last cell.
In the "ray" unit of work (`tests.scheduling`, with the CLI's Ray runs), so that it never runs
beside another command that starts a Ray instance of its own."""
import pytest

from tests.notebooks.runner import images, run_notebook



def test_elastic_rollout_kills_a_worker_and_loses_no_token(tmp_path):
  nb, v = run_notebook("04_elastic_rollout_ray.ipynb", str(tmp_path), timeout=400, probe=(
      "dict(lost=[e[2] for e in manager.fleet.events if e[1] == 'lost'], "
      "migrated=manager.fleet.stats.migrated, kept=manager.fleet.stats.tokens_kept, "
      "held={str(k): n for k, n in held.items()}, done=len(done), "
      "ray_up=ray.is_initialized())"))
  # The notebook itself asserts that no request was lost or duplicated, that the survivors
  # generated only the tokens w0 had not, and that every response equals the undisturbed one.
  assert v["lost"] == ["w0"] and v["done"] == 12
  assert v["migrated"] >= 1 and v["kept"] == sum(v["held"].values()) > 0
  assert not v["ray_up"]
  out = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
  assert "equal the undisturbed ones" in out
  assert images(nb) == 1

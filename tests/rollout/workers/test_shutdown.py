"""In-process worker threads end before the interpreter does: `kill()` / `close()` join them,
and a process that exits with workers still generating joins them in an exit hook (a daemon
thread inside XLA during interpreter shutdown aborted runs: "terminate called ... FATAL:
exception not rethrown", exit -6)."""
import subprocess
import sys
import threading

from jaxrl_sys.rollout import RolloutManager, ThreadWorker
from tests.rollout import common

ROOT = __file__.rsplit("/tests/", 1)[0]


def _rollout_threads() -> list[str]:
  return sorted(t.name for t in threading.enumerate()
                if t.name.startswith("rollout-") and t.is_alive())


def test_close_joins_the_worker_threads():
  before = _rollout_threads()
  ws = [ThreadWorker(f"join{i}", common.CFG, common.engine_config()) for i in range(2)]
  m = RolloutManager(ws)
  m.publish(common.params(), 0)
  m.submit(common.make_requests(4, seed=3))
  assert m.poll(min_count=1, timeout=120.0)
  assert [n for n in _rollout_threads() if n not in before] == ["rollout-join0", "rollout-join1"]
  m.close()  # kills each worker: its thread finishes the exchange in flight and ends
  assert [n for n in _rollout_threads() if n not in before] == []


SCRIPT = """
import atexit, sys, threading
# Registered first, so it runs last of the exit hooks: what is still alive at that point
# would meet the interpreter's teardown.
atexit.register(lambda: print("alive at exit:", sorted(
    t.name for t in threading.enumerate() if t.name.startswith("rollout-") and t.is_alive()),
    flush=True))
from jaxrl_sys.rollout import Commands, RolloutManager, ThreadWorker
from tests.rollout import common
ws = [ThreadWorker(f"w{i}", common.CFG, common.engine_config(), token_delay=0.1)
      for i in range(2)]
m = RolloutManager(ws)
m.publish(common.params(), 0)
m.submit(common.make_requests(4, seed=5))
m.poll(min_count=1, timeout=120.0)
for w in ws:  # an exchange in flight on each thread, as when an error leaves a round midway
  w.send(Commands())
print("exiting with", m.num_pending(), "requests generating", flush=True)
sys.exit(0)  # no close()
"""


def test_exit_with_workers_generating_joins_them_first():
  res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, check=False)
  assert res.returncode == 0, res.stderr[-3000:]
  assert "requests generating" in res.stdout and "alive at exit: []" in res.stdout, res.stdout
  assert "Fatal Python error" not in res.stderr and "terminate called" not in res.stderr

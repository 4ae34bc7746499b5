"""SIGHUP (a closed SSH terminal) stops a run like SIGTERM: the step finishes and is saved; the
output that would go to the hung-up terminal goes to /dev/null (issue 44: exit 129 at once, the
save in flight dropped, `.lock` left behind)."""
import os
import pty
import subprocess
import sys

from tests.docs.commands import REPO

_CHILD = r"""
import os, signal, sys, time
from jaxrl_sys.train.loop.stop_signals import StopSignals
said = []
stops = StopSignals(said.append)
stops.install()
os.kill(os.getpid(), signal.SIGHUP)
time.sleep(0.1)
print("after the hangup", file=sys.stderr, flush=True)  # EIO on a hung-up terminal
with open(sys.argv[1], "w") as f:
  f.write(f"{stops.stop.is_set()} {stops.name} {said}")
"""


def test_sighup_asks_the_run_to_finish_and_detaches_from_the_terminal(tmp_path):
  leader, follower = pty.openpty()
  report = tmp_path / "report"
  p = subprocess.run([sys.executable, "-c", _CHILD, str(report)], cwd=REPO, stdin=follower,
                     stdout=follower, stderr=follower, timeout=120, check=False)
  os.close(follower)
  out = b""
  try:
    while chunk := os.read(leader, 4096):
      out += chunk
  except OSError:  # the pty's end of data
    pass
  os.close(leader)
  assert p.returncode == 0, out.decode(errors="replace")
  assert report.read_text() == (
      "True SIGHUP ['SIGHUP: finishing the current step, then saving and exiting']")
  assert b"after the hangup" not in out  # went to /dev/null, not to the (gone) terminal

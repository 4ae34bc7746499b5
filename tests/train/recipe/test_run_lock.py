"""Run-directory ownership: a live run's directory is refused to --overwrite / --resume, a dead
run's lock is reclaimed with a message, and unwritable output paths fail before any work."""
import json
import os
import socket
import subprocess
import sys

import pytest

from jaxrl_sys.train.recipe import run_dir, run_lock


def _write_lock(d, **fields):
  owner = {"pid": 1, "host": socket.gethostname(), "started": 1.7e9, "proc_start": None}
  owner.update(fields)
  (d / run_lock.LOCK_NAME).write_text(json.dumps(owner))


def _previous_run(d):
  os.makedirs(d / "checkpoints" / "2")
  (d / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')


def test_live_run_is_not_overwritten_and_is_named(tmp_path):
  d = tmp_path / "run"
  _previous_run(d)
  live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    _write_lock(d, pid=live.pid, proc_start=run_lock._proc_start_tick(live.pid))
    for kw in (dict(overwrite=True), dict(resume=True), {}):
      with pytest.raises(run_lock.RunDirLockedError) as e:
        run_dir.claim_run_dir(str(d), **kw)
      assert f"pid {live.pid} on host {socket.gethostname()!r}" in str(e.value)
      assert f"kill -TERM {live.pid}" in str(e.value)
    # nothing of the live run was touched, its lock included
    assert (d / "metrics.jsonl").read_text().count("step") == 2 and (d / "checkpoints").is_dir()
    assert json.loads((d / ".lock").read_text())["pid"] == live.pid
  finally:
    live.kill()
    live.wait()


def test_stale_lock_of_a_dead_process_is_reclaimed_with_a_message(tmp_path):
  d = tmp_path / "run"
  _previous_run(d)
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()  # exited and reaped: its pid names no process
  _write_lock(d, pid=dead.pid)
  said = []
  path, lock = run_dir.claim_run_dir(str(d), resume=True, message=said.append)
  assert path == str(d) and len(said) == 1
  assert "reclaimed a stale lock" in said[0] and f"pid {dead.pid}" in said[0]
  mine = json.loads((d / ".lock").read_text())
  assert mine["pid"] == os.getpid() and mine["host"] == socket.gethostname()
  assert (d / "metrics.jsonl").exists()  # --resume keeps the outputs
  # while this process holds it, a second claim (another run in this process) is refused
  with pytest.raises(run_lock.RunDirLockedError, match=f"pid {os.getpid()}"):
    run_dir.claim_run_dir(str(d), overwrite=True)
  lock.release()
  assert not (d / ".lock").exists()
  run_dir.prepare_run_dir(str(d), overwrite=True)  # free again: --overwrite clears the run
  assert sorted(os.listdir(d)) == []


def test_pid_reused_by_another_process_is_stale(tmp_path):
  d = tmp_path / "run"
  os.makedirs(d)
  # this process's pid, but a start tick that is not this process's: an earlier owner
  _write_lock(d, pid=os.getppid(), proc_start=-5)
  said = []
  _, lock = run_dir.claim_run_dir(str(d), message=said.append)
  lock.release()
  assert said and "no longer exists" in said[0]


def test_lock_of_another_host_is_refused_with_the_way_out(tmp_path):
  d = tmp_path / "run"
  os.makedirs(d)
  _write_lock(d, host="node-17", pid=4242)
  with pytest.raises(run_lock.RunDirLockedError,
                     match=r"pid 4242 on host 'node-17'.*another host.*delete .*\.lock"):
    run_dir.claim_run_dir(str(d), overwrite=True)
  (d / ".lock").write_text("{half")
  with pytest.raises(run_lock.RunDirLockedError, match="unreadable lock file"):
    run_dir.claim_run_dir(str(d))


def test_resume_with_overwrite_is_refused(tmp_path):
  with pytest.raises(ValueError, match="--resume continues .* --overwrite deletes it"):
    run_dir.claim_run_dir(str(tmp_path / "run"), overwrite=True, resume=True)
  assert not (tmp_path / "run").exists()


def test_unwritable_output_paths_fail_with_a_message(tmp_path):
  with pytest.raises(ValueError, match=r"--out_dir=/proc/self/x: cannot write there"):
    run_dir.check_directory_path("/proc/self/x", "--out_dir")
  ro = tmp_path / "ro"
  os.makedirs(ro)
  os.chmod(ro, 0o555)
  try:
    if os.access(ro, os.W_OK):  # root ignores permission bits: a read-only mount instead
      with pytest.raises(ValueError, match="--checkpoint_dir=/sys/x: cannot write there .*sys "
                                           "exists"):
        run_dir.check_directory_path("/sys/x", "--checkpoint_dir")
    else:
      with pytest.raises(ValueError, match="cannot write there.*permission denied"):
        run_dir.check_directory_path(str(ro / "run"), "--checkpoint_dir")
  finally:
    os.chmod(ro, 0o755)


def test_every_directory_a_run_writes_is_locked_like_the_run_dir(tmp_path):
  ckpt = tmp_path / "ckpts"
  said = []
  lock = run_dir.claim_checkpoint_dir(str(ckpt), str(tmp_path / "run_a"), message=said.append)
  assert lock is not None and lock.held and not said
  assert json.loads((ckpt / ".lock").read_text())["pid"] == os.getpid()
  # a second run (here: this process again) using the same checkpoint directory is refused
  with pytest.raises(run_lock.RunDirLockedError, match=r"--checkpoint_dir=.*ckpts is in use by "
                                                       rf"the running job of pid {os.getpid()}"):
    run_dir.claim_checkpoint_dir(str(ckpt), str(tmp_path / "run_b"))
  lock.release()
  assert not (ckpt / ".lock").exists()
  # a dead run's lock is reclaimed with a message naming the flag
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  _write_lock(ckpt, pid=dead.pid)
  lock = run_dir.claim_checkpoint_dir(str(ckpt), None, message=said.append)
  assert len(said) == 1 and "stale lock of --checkpoint_dir=" in said[0]
  lock.release()
  # Issue 44: a run's own checkpoints/ is locked too. Run B pointed at run A's checkpoints
  # (`--checkpoint_dir=runs/a/checkpoints --resume`) resumed A's live state and overwrote it.
  own = run_dir.claim_checkpoint_dir(None, str(tmp_path / "a"))
  assert own.path == str(tmp_path / "a" / "checkpoints" / ".lock")
  with pytest.raises(run_lock.RunDirLockedError, match=r"--checkpoint_dir=.*a/checkpoints is in "
                                                       "use by the running job"):
    run_dir.claim_checkpoint_dir(str(tmp_path / "a" / "checkpoints"), str(tmp_path / "b"))
  # ... and so are the export and a local weight store; an export holding only its lock is empty
  export = run_dir.claim_output_dir(str(tmp_path / "hf"), "--export_hf")
  run_dir.check_export_dir(str(tmp_path / "hf"), None, overwrite=False, resume=False)
  with pytest.raises(run_lock.RunDirLockedError, match=r"--export_hf=.*hf is in use"):
    run_dir.claim_output_dir(str(tmp_path / "hf"), "--export_hf")
  assert run_dir.local_store_dir(f"tensorstore:{tmp_path}/w") == f"{tmp_path}/w"
  assert run_dir.local_store_dir("tensorstore:gs://b/w") is None
  assert run_dir.local_store_dir("ray") is None
  own.release()
  export.release()
  assert run_dir.previous_run_entries(str(tmp_path / "a")) == []  # an empty checkpoints/

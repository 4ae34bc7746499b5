"""Ctrl-C on `python -m experiments.grpo` (a subprocess, real signals): the first SIGINT
finishes the step, saves and exits 130 with one line; a second one stops at once after the save
in flight; a live run's directory is refused to another run meanwhile."""
import os
import re
import signal
import time

import pytest

from jaxrl_sys.train.recipe.run_dir import claim_checkpoint_dir, claim_run_dir
from jaxrl_sys.train.recipe.run_lock import RunDirLockedError
from tests.experiments.test_grpo_cli import _committed_steps, _start, _wait_for


def _no_traceback(err):
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_sigint_saves_and_exits_130_then_a_second_one_stops_at_once(tmp_path):
  out, ck = str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints")
  args = ["--steps=400", "--save_every=2", f"--out_dir={out}"]
  p = _start(args)
  assert _wait_for(lambda: os.path.isdir(ck) and _committed_steps(ck), p)
  # a second run may not take the live run's directory, by --overwrite or --resume
  for kw in (dict(overwrite=True), dict(resume=True)):
    with pytest.raises(RunDirLockedError, match=f"in use by the running job of pid {p.pid}"):
      claim_run_dir(out, **kw)
  # ... nor its checkpoints from another run directory (issue 44: `--checkpoint_dir=<live
  # run>/checkpoints --resume` resumed the live state, and the live run died at its next save)
  with pytest.raises(RunDirLockedError, match=rf"--checkpoint_dir={ck} is in use by the running "
                                              f"job of pid {p.pid}"):
    claim_checkpoint_dir(ck, str(tmp_path / "other"))
  p.send_signal(signal.SIGINT)
  _, err = p.communicate(timeout=180)
  assert p.returncode == 130, err
  _no_traceback(err)
  (line,) = [s for s in err.splitlines() if s.startswith("interrupted")]
  step = int(re.match(r"interrupted \(SIGINT\) after step (\d+)/400: checkpoint saved; continue "
                      r"with --resume$", line).group(1))
  assert _committed_steps(ck)[-1] == step  # the stopping step was saved, not only step % 2
  assert os.path.exists(os.path.join(out, "final_params.npz"))
  assert not os.path.exists(os.path.join(out, ".lock"))
  assert not os.path.exists(os.path.join(ck, ".lock"))

  p = _start(args + ["--resume"])
  assert _wait_for(lambda: _committed_steps(ck)[-1] >= step + 2, p)
  p.send_signal(signal.SIGINT)
  time.sleep(0.3)
  p.send_signal(signal.SIGINT)
  _, err = p.communicate(timeout=180)
  assert p.returncode == 130, err
  _no_traceback(err)
  assert f"resumed from step {step}" in err
  assert len([s for s in err.splitlines() if s.startswith("interrupted")]) == 1, err
  # the save in flight was completed, none is left half-written, the lock is gone
  assert not [d for d in os.listdir(ck) if "tmp" in d], os.listdir(ck)
  assert all(os.path.exists(os.path.join(ck, d, "_CHECKPOINT_METADATA"))
             for d in os.listdir(ck) if d.isdigit())
  assert not os.path.exists(os.path.join(out, ".lock"))


def test_a_second_sigint_while_the_outputs_are_written_loses_none(tmp_path):
  """The first SIGINT ends the loop; a second one sent as soon as the run writes its outputs
  (final parameters, plot) is the run's second SIGINT: the outputs are all written, exit 130,
  no KeyboardInterrupt (which used to abort the write, or print inside a GC callback)."""
  out = str(tmp_path / "run")
  ck = os.path.join(out, "checkpoints")
  p = _start(["--steps=400", "--save_every=2", f"--out_dir={out}"])
  assert _wait_for(lambda: os.path.isdir(ck) and _committed_steps(ck), p)
  p.send_signal(signal.SIGINT)
  assert _wait_for(lambda: any(n.startswith("final_params") for n in os.listdir(out)), p)
  p.send_signal(signal.SIGINT)
  _, err = p.communicate(timeout=180)
  assert p.returncode == 130, err
  _no_traceback(err)
  assert "Exception ignored" not in err, err
  for name in ("final_params.npz", "reward_kl.png", "config.json"):
    assert os.path.exists(os.path.join(out, name)), (name, err)
  assert "outputs:" in err, err

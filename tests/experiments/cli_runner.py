"""`python -m experiments.grpo` run inside the test process: the command's own flags, `main`,
exit statuses and messages, without a new interpreter (a subprocess spends ~5 CPU-s on imports
and JAX start-up before it reads a flag). For tests whose subject is a run's settings, outputs or
errors; tests of signals, locks held by live processes and the command as a process keep
`subprocess`.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal

from absl import flags

from tests.docs.commands import REPO

CACHE = f"--compile_cache={os.path.join(REPO, '.jax_cache')}"


def run_grpo(args: list[str]) -> tuple[int, str]:
  """Parses `args` as the command line of `python -m experiments.grpo` and runs its `main`.

  Returns (exit status, what it wrote to stderr). A flag absl rejects gives status 1 and absl's
  message, as `app.run` does; the flags are reset to their defaults afterwards, and the SIGINT
  handler `main` installs is restored. The suite's compilation cache is used unless `args`
  names one.
  """
  from experiments import grpo  # pylint: disable=import-outside-toplevel
  fv = grpo.FLAGS
  err = io.StringIO()
  handler = signal.getsignal(signal.SIGINT)
  if not any(a.startswith("--compile_cache") for a in args):
    args = [CACHE, *args]
  try:
    fv.unparse_flags()
    try:
      fv(["experiments.grpo", *args])
    except flags.Error as e:
      return 1, f"FATAL Flags parsing error: {e}"
    with contextlib.redirect_stderr(err):
      code = grpo.main(["experiments.grpo"])
  finally:
    fv.unparse_flags()
    signal.signal(signal.SIGINT, handler)
  return code, err.getvalue()

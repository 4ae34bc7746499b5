"""Reruns issue 44's probe (143 fault and bad-input cases, N1-N143) and the first-use journeys'
findings (J1-...) and counts the verdicts.

    PYTHONPATH=$PWD .venv/bin/python scripts/probe_cases.py [--only ID[,ID...]] [--skip ...]
        [--json OUT.json]

Each case runs the CLI (`python -m experiments.grpo` / `experiments.spot_sim`, subprocesses with
real signals, real full disks (a small tmpfs: root only), real multi-process jobs and Ray) or a
few lines of Python, under a time limit, and gets one verdict (`scripts/fault_cases.py`'s):
ok, clear error, silent wrong, traceback, data lost, hang, or skipped (with the reason). An
expected error must name the problem: a refusal whose text does not match is "silent wrong"
(a misleading message); a clear refusal of something that should have worked is a clear error
(the probe's verdict). Areas: config, dtypes, outputs, locks, processes, stores, ray, rewards,
data, sim, signals, losses, journeys (`--only` takes ids or area names; `--skip` too). The
cases live in `probe_cases_{train,jobs,data,api}.py`, the helpers in `probe_lib.py`.

Not run by CI: about 40 minutes on 2 busy CPU cores. Run it under the machine's heavy-job lock.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=wrong-import-position
from probe_cases_api import ApiCases  # noqa: E402
from probe_cases_data import DataCases  # noqa: E402
from probe_cases_jobs import JobCases  # noqa: E402
from probe_cases_train import TrainCases  # noqa: E402


class Probe(TrainCases, JobCases, DataCases, ApiCases):
  """Every case (see the module docstring)."""


AREAS = {"n1": "config", "n17": "dtypes", "n31": "outputs", "n33": "locks", "n42": "processes",
         "n54": "stores", "n61": "ray", "n67": "rewards", "n81": "data", "n94": "sim",
         "n121": "signals", "n127": "losses", "j1": "journeys"}


def all_cases(probe: Probe) -> list[tuple[str, str, str, Callable]]:
  """(id, area, title, method) in the report's order."""
  out = []
  for name in dir(probe):
    if name.startswith("case_"):
      fn = getattr(probe, name)
      ident, area, title = fn.__doc__.split(None, 2)
      out.append((ident, area.rstrip(":"), " ".join(title.split()), fn))
  key = lambda c: (c[0][0] != "N", int(c[0][1:]))  # noqa: E731
  return sorted(out, key=key)


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", default="", help="comma-separated ids (N8, J3) or areas (config)")
  ap.add_argument("--skip", default="", help="the same, to leave out")
  ap.add_argument("--json", default="", help="write the verdicts here")
  ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
  ap.add_argument("--list", action="store_true", help="list the cases and exit")
  args = ap.parse_args()
  only = {x.strip().lower() for x in args.only.split(",") if x.strip()}
  skip = {x.strip().lower() for x in args.skip.split(",") if x.strip()}
  tmp = tempfile.mkdtemp(prefix="probe_cases_")
  probe = Probe(tmp)
  cases = all_cases(probe)
  if args.list:
    for ident, area, title, _ in cases:
      print(f"{ident:5s} {area:10s} {title}")
    return 0
  chosen = [c for c in cases if (not only or c[0].lower() in only or c[1] in only)
            and c[0].lower() not in skip and c[1] not in skip]
  table = []
  try:
    for ident, area, title, fn in chosen:
      t0 = time.monotonic()
      try:
        got, detail = fn()
      except Exception as e:  # pylint: disable=broad-except  (a harness failure, not a verdict)
        got, detail = "harness error", f"{type(e).__name__}: {e}"[:200]
      table.append({"id": ident, "area": area, "case": title, "verdict": got,
                    "detail": detail, "seconds": round(time.monotonic() - t0, 1)})
      print(f"{ident:5s} {got:13s} {title}: {detail}", file=sys.stderr, flush=True)
      if args.json:
        with open(args.json, "w") as f:
          json.dump(table, f, indent=1)
  finally:
    if not args.keep:
      subprocess.run(["umount", "-l", *[os.path.join(tmp, n) for n in os.listdir(tmp)
                                        if n.endswith("disk")]], capture_output=True, check=False)
      shutil.rmtree(tmp, ignore_errors=True)
  counts: dict[str, int] = {}
  for row in table:
    counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
  print("\n" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" ({len(table)} cases)")
  return 0


if __name__ == "__main__":
  sys.exit(main())

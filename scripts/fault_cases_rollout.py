"""The rollout-side fault cases of `scripts/fault_cases.py --rollout`: RolloutManager waits and
weight checks through the API (each a few lines of Python that must end in a one-line error),
Ray addresses, and a corrupt tensorstore version under Ray workers."""
from __future__ import annotations

import os
from typing import Callable

from fault_lib import Scratch, _rows, _wait, cli, py, verdict_of


class RolloutCases(Scratch):
  """The rollout-side cases, each returning (verdict, detail); `tmp` holds their files."""

  def rollout_cases(self, want: Callable[[str], bool] = lambda name: True):
    got = []
    if want("RolloutManager([]).poll()"):
      r = py("from jaxrl_sys.rollout import RolloutManager\n"
             "print(RolloutManager([]).poll(timeout=5))", timeout=60)
      got.append(("RolloutManager([]).poll()", verdict_of(r, r.rc == 0 and "[]" in r.err),
                  f"rc {r.rc} in {r.seconds:.0f} s"))
    for name, code, exc, error in API_CASES:
      if want(name):
        r = py(_api(code, exc), timeout=120)
        first = next((x for x in r.err.splitlines() if x.startswith("error:")), "")
        got.append((name, verdict_of(r, False, error=error), f"{first[:100]} ({r.seconds:.0f} s)"))
    for name, fn in (("--ray_address=auto with no cluster", self.ray_auto),
                     ("corrupt tensorstore version, Ray workers", self.corrupt_weights_ray)):
      if want(name):
        got.append((name, *fn()))
    return got

  def ray_auto(self):
    """--ray_address=auto with no cluster: Ray looks in its temp dir (RAY_TMPDIR, here an empty
    one) and, for "auto", at the machine's gcs_server processes; another user's running cluster
    would be joined, so the case is skipped then."""
    import psutil  # pylint: disable=import-outside-toplevel
    if any("gcs_server" in (p.info["name"] or "") for p in psutil.process_iter(["name"])):
      return "skipped", "a Ray cluster runs on this machine (another user's): 'auto' would join it"
    tmp = self.d("ray_tmp")
    os.makedirs(tmp, exist_ok=True)
    r = cli(["--rollout=ray", "--ray_address=auto", f"--out_dir={self.d('auto')}"],
            env={"RAY_TMPDIR": tmp, "RAY_ADDRESS": ""}, timeout=180)
    first = next((x for x in r.err.splitlines() if x.startswith("error:")), "")
    return verdict_of(r, False, error=r"could not start or reach Ray \(auto\)"), first[:100]

  def corrupt_weights_ray(self):
    """Issue 30's case 1: 16 bytes flipped in the largest file of a stored version (v3, or the
    newest one after it when v3 is already collected) once its manifest appears; the run must
    recover or stop with a clear error, within the deadline."""
    out, ws = self.d("ws_run"), self.d("ws")
    flipped = []

    def act(p):
      # pylint: disable-next=import-outside-toplevel
      from tests.rollout.manager.test_deadlines import flip_largest_file
      while not flipped and _wait(lambda: stored_versions(ws, 3), p, timeout=400):
        for v in reversed(stored_versions(ws, 3)):
          try:  # the store collects old versions: one may go between listing and flipping
            flipped.append((v, os.path.basename(flip_largest_file(f"{ws}/v{v}"))))
            break
          except FileNotFoundError:
            continue
    r = cli(["--rollout=ray", "--num_workers=2", "--steps=6", f"--weight_store=tensorstore:{ws}",
             f"--out_dir={out}"], timeout=500, signals=act)
    lines = [x for x in r.err.splitlines() if x.startswith("error:")]
    recovered = r.rc == 0 and _rows(out) == list(range(1, 7))
    reported = (r.rc in (1, 2) and len(lines) == 1 and bool(flipped)
                and f"weight version {flipped[0][0]}" in lines[0] and ws in lines[0])
    detail = (f"rc {r.rc} in {r.seconds:.0f} s, flipped {flipped}, rows {_rows(out)}, "
              f"{lines[0][:90] if lines else 'no error line'}")
    return verdict_of(r, (recovered or reported) and bool(flipped)), detail


def stored_versions(ws: str, first: int) -> list[int]:
  """The versions >= `first` in weight store folder `ws` whose manifest is written, ascending."""
  names = os.listdir(ws) if os.path.isdir(ws) else []
  found = [int(n[1:]) for n in names if n[:1] == "v" and n[1:].isdigit() and int(n[1:]) >= first]
  return sorted(v for v in found if os.path.exists(f"{ws}/v{v}/manifest.json"))


def _api(code: str, exc: str) -> str:
  """`code` run so that the expected exception `exc` becomes a one-line `error:` and exit 2
  (what a user of the API sees as a clear error); any other exception is a traceback."""
  body = "\n".join("  " + line for line in code.strip().splitlines())
  return (f"import sys\nfrom jaxrl_sys.rollout import {exc}\ntry:\n{body}\n"
          f"except {exc} as e:\n  print('error:', str(e).splitlines()[0][:600], file=sys.stderr)\n"
          "  sys.exit(2)\n")


_ROLLOUT_SETUP = """
import numpy as np, jax, jax.numpy as jnp
from jaxrl_sys.rollout import InProcessWorker, RolloutManager
from tests.rollout import common
"""
# (name, code, the exception it must raise, the message it must contain)
API_CASES = [
    ("poll after submit without publish", _ROLLOUT_SETUP + """
m = RolloutManager([InProcessWorker("w0", common.CFG, common.engine_config())])
m.submit(common.make_requests(2))
m.poll(timeout=30)
""", "RolloutStalledError", "no weight version was published: call publish"),
    ("wrong-shaped first publish", _ROLLOUT_SETUP + """
p = dict(common.params()); p["embed"] = p["embed"][:, :16]
m = RolloutManager([InProcessWorker("w0", common.CFG, common.engine_config())])
m.publish(p, 0)
m.submit(common.make_requests(1))
m.poll(timeout=60)
""", "WeightLoadError", r"wrong shape: \['embed'\]"),
    ("int32 published params", _ROLLOUT_SETUP + """
p = jax.tree.map(lambda x: x.astype(jnp.int32), common.params())
m = RolloutManager([InProcessWorker("w0", common.CFG, common.engine_config())])
m.publish(p, 0)
m.submit(common.make_requests(1))
m.poll(timeout=60)
""", "WeightLoadError", "not floating point"),
    ("submit with no workers", _ROLLOUT_SETUP + """
m = RolloutManager([])
m.publish(common.params(), 0)
m.submit(common.make_requests(3))
m.poll(min_count=3, timeout=30)
""", "RolloutStalledError", "3 requests pending and no workers"),
    ("corrupt tensorstore version, in-process worker", _ROLLOUT_SETUP + """
import os, tempfile
from jaxrl_sys.rollout.weights.tensorstore import TensorstoreWeightStore
from tests.rollout.manager.test_deadlines import flip_largest_file
d = tempfile.mkdtemp()
store = TensorstoreWeightStore(d)
m = RolloutManager([InProcessWorker("w0", common.CFG, common.engine_config())], store=store)
m.publish(common.params(), 0)
store.wait()
flip_largest_file(os.path.join(d, "v0"))
m.submit(common.make_requests(2))
m.poll(timeout=60)
""", "WeightLoadError", "weight version 0 could not be loaded .*CorruptWeightsError"),
]

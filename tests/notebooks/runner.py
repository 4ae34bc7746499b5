"""Runs a notebook of `notebooks/` headless (nbclient) in small mode, as CI does, and reads
values back from its kernel."""
import json
import os
import re

import nbformat
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(REPO, "notebooks")
_MARK = "__probe__"


def kernel_env() -> dict:
  """The test session's environment for the kernel: small settings, CPU, one device (as on a
  laptop or a CPU Colab runtime), the suite's compilation cache, no Ray address (a notebook
  starts its own local Ray instance, never the test session's)."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                            env.get("XLA_FLAGS", "")).strip()
  env.pop("RAY_ADDRESS", None)
  env.pop("MPLBACKEND", None)  # the kernel's inline backend draws the figures
  env.update(JAXRL_SMALL="1", JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=os.path.join(REPO, ".jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", TOKENIZERS_PARALLELISM="false")
  return env


def run_notebook(name: str, cwd: str, probe: str = "{}", timeout: int = 300):
  """Executes `notebooks/<name>` top to bottom in `cwd`, then evaluates the Python expression
  `probe` in its kernel. Returns (the executed notebook, the probe's value via JSON). A cell
  that raises fails the call with the cell and its traceback (nbclient's CellExecutionError)."""
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  nb.cells.append(nbformat.v4.new_code_cell(
      f"import json as _json\nprint({_MARK!r} + _json.dumps({probe}, default=float))"))
  client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                          resources={"metadata": {"path": cwd}})
  client.execute(env=kernel_env())
  text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
  value = json.loads(text[text.index(_MARK) + len(_MARK):])
  return nb, value


def images(nb) -> int:
  """How many PNG figures the notebook's outputs hold."""
  return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
             for o in c.outputs)


def code_cells(nb) -> list[str]:
  return [c.source for c in nb.cells if c.cell_type == "code"]

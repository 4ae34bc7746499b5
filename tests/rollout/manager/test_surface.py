"""Nothing outside `rollout/manager/` writes the manager's state: every field of the manager and
its core is private, what they show is read-only (a write raises, answers are copies), and no
module or notebook outside `manager/` reaches a private field or writes through a view."""
import ast
import json
import pathlib
import re

import numpy as np
import pytest

from jaxrl_sys.rollout import ManualClock, MemoryWeightStore, RolloutManager
from jaxrl_sys.rollout.manager.core import ManagerCore
from tests.rollout.fake_worker import FakeWorker, make_requests

ROOT = pathlib.Path(__file__).resolve().parents[3]
MANAGER = ROOT / "jaxrl_sys" / "rollout" / "manager"
# Private fields of the manager's classes that no other class of the repository has.
PRIVATE = {"_core", "_table", "_reqs", "_ledger", "_handles", "_fleet", "_view", "_moves"}
VIEWS = {"fleet", "core", "handles"}  # what the manager shows; never written through


def _manager():
  clock = ManualClock()
  m = RolloutManager([FakeWorker("w0", clock)], store=MemoryWeightStore(), clock=clock)
  m.publish({"w": np.zeros(1, np.float32)}, 0)
  m.submit(make_requests(3))
  m.poll(min_count=1)
  return m


def test_the_manager_shows_its_state_read_only():
  m = _manager()
  for name in [n for n in dir(m) if not n.startswith("_")] + ["worker_cap", "workers"]:
    with pytest.raises(AttributeError):
      setattr(m, name, None)
  core, view = m.core, m.fleet
  assert all(s.startswith("_") for s in ManagerCore.__slots__)
  for name in ["fleet", "num_open", "last_progress", "worker_cap", "config"]:
    with pytest.raises(AttributeError):
      setattr(core, name, None)
  for name in ["cap", "latest", "stats", "events", "workers"]:
    with pytest.raises(AttributeError):
      setattr(view, name, None)
  w = view["w0"]
  for name in ["version", "assigned", "accepting", "outstanding", "local"]:
    with pytest.raises(AttributeError):
      setattr(w, name, None)
  with pytest.raises(TypeError):
    view["w1"] = w  # pylint: disable=unsupported-assignment-operation
  with pytest.raises(TypeError):
    del view["w0"]  # pylint: disable=unsupported-delete-operation
  with pytest.raises(TypeError):
    m.handles["w1"] = m.handles["w0"]  # pylint: disable=unsupported-assignment-operation
  before, n_events = m.metrics(), len(view.events)
  stats = view.stats
  stats.lost += 5
  stats.load_seconds.append(1.0)
  assert isinstance(w.assigned, tuple) and isinstance(w.running, frozenset)
  assert isinstance(view.events, tuple) and view.provenance(0) is not view.provenance(0)
  assert m.metrics() == before and len(view.events) == n_events and view.stats.lost == 0


# A file that never names a view or a private field cannot break the rule: only these parse.
MENTIONS = re.compile(r"\.(" + "|".join(sorted(PRIVATE | VIEWS)) + r")\b")


def _sources():
  """(path, module AST) of every Python file and notebook code cell outside `manager/` that
  names a view or a private field of the manager."""
  for top in ("jaxrl_sys", "experiments", "benchmarks", "scripts", "tests", "examples"):
    for path in sorted((ROOT / top).rglob("*.py")):
      if MANAGER in path.parents or path == pathlib.Path(__file__).resolve():
        continue
      text = path.read_text()
      if MENTIONS.search(text):
        yield path, ast.parse(text, str(path))
  for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    if MENTIONS.search(code):
      yield path, ast.parse(code, str(path))


def _chain(node):
  """The attribute names a target's value reaches through: `a.fleet["w"].version` -> fleet."""
  names = []
  node = node.value if isinstance(node, (ast.Attribute, ast.Subscript)) else None
  while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
    if isinstance(node, ast.Attribute):
      names.append(node.attr)
    node = node.func if isinstance(node, ast.Call) else node.value
  return names


def violations(tree: ast.AST) -> list[tuple[int, str]]:
  """Line and text of each reach into the manager's privates, or write through its views."""
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
      out.append((node.lineno, f"private manager field {node.attr}"))
    targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
               [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
    for t in targets:
      for part in (t.elts if isinstance(t, ast.Tuple) else [t]):
        through = VIEWS.intersection(_chain(part))
        if through:
          out.append((part.lineno, f"write through .{sorted(through)[0]}"))
  return out


def test_the_scan_finds_planted_writes():
  code = ("m.fleet.cap = 3\nm.fleet['w0'].version, x = 1, 2\ndel m.core.fleet\n"
          "m._core._table.set_cap(2)\nself.fleet = Fleet()\nsim.fleet.log.append(1)\n")
  got = violations(ast.parse(code))
  assert [line for line, _ in got] == [1, 2, 3, 4, 4], got


def test_nothing_outside_the_manager_writes_its_state():
  sources = list(_sources())
  assert any(p.name == "offload.py" for p, _ in sources)  # the elastic wing reads the view
  bad = [f"{path.relative_to(ROOT)}:{line}: {what}" for path, tree in sources
         for line, what in violations(tree)]
  assert not bad, "\n".join(bad)

"""The package's import structure: no import circle among jaxrl_sys modules, and the numpy-only
parts (manager, elastic controllers, worker protocol, simulator) load without JAX."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "jaxrl_sys"


def _modules() -> dict[str, pathlib.Path]:
  """Every module of the package: dotted name -> file (a package is its `__init__.py`)."""
  out = {}
  for path in sorted((ROOT / PACKAGE).rglob("*.py")):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _top_level_imports(tree: ast.Module):
  """Import statements executed when the module loads: those not inside a function body."""
  stack = list(tree.body)
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      continue
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node
    stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
  """module -> the package modules it imports at load time. `from a.b import c` is an edge to
  `a.b.c` when that is a module, else to `a.b`; relative imports are resolved."""
  graph = {}
  for name, path in modules.items():
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    edges = set()
    for node in _top_level_imports(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      else:
        if node.level:
          base = here[:len(here) - node.level + 1]
          mod = ".".join(base + ([node.module] if node.module else []))
        else:
          mod = node.module or ""
        targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod
                   for a in node.names]
      for t in targets:
        while t and t not in modules and "." in t:  # `import a.b.c` of a name inside a module
          t = t.rsplit(".", 1)[0]
        if t in modules and t != name:
          edges.add(t)
    graph[name] = edges
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import circle as a list of modules (first == last), or None (iterative DFS)."""
  color = dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done
  for start in sorted(graph):
    if color[start]:
      continue
    path, iters = [start], [iter(sorted(graph[start]))]
    color[start] = 1
    while path:
      nxt = next(iters[-1], None)
      if nxt is None:
        color[path.pop()] = 2
        iters.pop()
      elif color[nxt] == 1:
        return path[path.index(nxt):] + [nxt]
      elif color[nxt] == 0:
        color[nxt] = 1
        path.append(nxt)
        iters.append(iter(sorted(graph[nxt])))
  return None


def test_the_cycle_finder_finds_a_planted_circle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert find_cycle(graph) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_resolves_relative_and_from_imports(tmp_path):
  pkg = tmp_path / "p"
  (pkg / "q").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "q" / "__init__.py").write_text("from . import r\n")
  (pkg / "q" / "r.py").write_text("from ..s import X\ndef f():\n  import p.t\n")
  (pkg / "s.py").write_text("import p.q.r\n")
  (pkg / "t.py").write_text("")
  mods = {"p": pkg / "__init__.py", "p.q": pkg / "q" / "__init__.py", "p.q.r": pkg / "q" / "r.py",
          "p.s": pkg / "s.py", "p.t": pkg / "t.py"}
  graph = import_graph(mods)
  assert graph["p.q"] == {"p.q.r"} and graph["p.q.r"] == {"p.s"} and graph["p.s"] == {"p.q.r"}
  assert find_cycle(graph) in (["p.q.r", "p.s", "p.q.r"], ["p.s", "p.q.r", "p.s"])


def test_no_import_circle_in_the_package():
  modules = _modules()
  assert "jaxrl_sys.rollout.manager.core" in modules and len(modules) > 50
  cycle = find_cycle(import_graph(modules))
  assert cycle is None, f"import circle: {' -> '.join(cycle)}"


def test_manager_elastic_and_simulator_import_without_jax():
  code = ("import sys, jaxrl_sys.sim, jaxrl_sys.rollout.manager, jaxrl_sys.rollout.elastic.offload,"
          " jaxrl_sys.rollout.elastic.fleet, jaxrl_sys.rollout.elastic.schedules,"
          " jaxrl_sys.rollout.workers, jaxrl_sys.rollout.weights, jaxrl_sys.rollout\n"
          "from jaxrl_sys.rollout import RolloutManager, ManagerConfig, Request, WorkerLost\n"
          "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'flax')))\n"
          "assert not bad, bad[:5]\n"
          "from jaxrl_sys.rollout import Engine\n"  # the lazy attribute still resolves
          "assert 'jax' in sys.modules and Engine.__name__ == 'Engine'\n")
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, check=False)
  assert res.returncode == 0, res.stderr[-2000:]

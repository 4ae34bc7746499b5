"""The package's import structure: imports run one way down the layers of docs/architecture.md
(`LAYERS`), there is no import circle among jaxrl_sys modules (counting function-level imports,
`TYPE_CHECKING` imports and the module names of lazy-attribute tables and name registries), and
the numpy-only parts (manager, elastic controllers, worker protocol, simulator) load without
JAX."""
import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "jaxrl_sys"


# Lowest first. A module may import modules of its own layer or below, never above; the longest
# prefix names a module's layer (`jaxrl_sys.train.loop.rl_loop` is in "jaxrl_sys.train.loop").
LAYERS = (
    ("jaxrl_sys", "jaxrl_sys._lazy", "jaxrl_sys.backend", "jaxrl_sys.utils"),
    ("jaxrl_sys.kernels", "jaxrl_sys.losses", "jaxrl_sys.sharding"),
    ("jaxrl_sys.models",),
    ("jaxrl_sys.tasks",),
    ("jaxrl_sys.rollout",),
    ("jaxrl_sys.agents",),  # multi-turn episodes over a rollout session (tasks' envs)
    ("jaxrl_sys.sim",),
    ("jaxrl_sys.train.step", "jaxrl_sys.train.precision"),
    ("jaxrl_sys.train.multihost",),
    ("jaxrl_sys.train.loop",),
    ("jaxrl_sys.train.recipe",),
    ("jaxrl_sys.train",),  # the package face: names everything below, lazily
)


def _modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
  """Every module of the package under `root`: dotted name -> file (a package is its
  `__init__.py`)."""
  out = {}
  for path in sorted((root / PACKAGE).rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
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


def _every_import(tree: ast.Module):
  """Every import statement, function-level (lazy) ones and `TYPE_CHECKING` blocks included."""
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node


def _named_modules(tree: ast.Module, modules) -> set[str]:
  """Package modules a string constant names, as the lazy-attribute tables
  (`{"Engine": "jaxrl_sys.rollout.engine"}`) and the name registries
  (`"jaxrl_sys.rollout.setup.ray:ray_client"`) do: imported by `importlib` later."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      name = node.value.split(":", 1)[0]
      if name.startswith(PACKAGE + ".") and name in modules:
        out.add(name)
  return out


def import_graph(modules: dict[str, pathlib.Path], *, lazy: bool = False) -> dict[str, set[str]]:
  """module -> the package modules it imports at load time (`lazy`: at any time: imports inside
  functions too, and the modules its lazy-attribute tables and registries name). `from a.b
  import c` is an edge to `a.b.c` when that is a module, else to `a.b`; relative imports are
  resolved."""
  graph = {}
  for name, path in modules.items():
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    edges = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in (_every_import if lazy else _top_level_imports)(tree):
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
    if lazy:
      edges |= _named_modules(tree, modules) - {name}
    graph[name] = edges
  return graph


def layer_of(module: str) -> int:
  """The index in `LAYERS` of `module`'s longest matching prefix."""
  best = max(((len(p), i) for i, prefixes in enumerate(LAYERS) for p in prefixes
              if module == p or module.startswith(p + ".")), default=None)
  if best is None or (best[0] == len(PACKAGE) and module != PACKAGE):
    raise KeyError(f"{module} is in no layer of LAYERS: add its package there (and to "
                   "docs/architecture.md)")
  return best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
  """Every edge from a module to one of a higher layer."""
  return sorted((a, b) for a, edges in graph.items() for b in edges if layer_of(b) > layer_of(a))


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
  for lazy in (False, True):
    cycle = find_cycle(import_graph(modules, lazy=lazy))
    assert cycle is None, f"import circle ({'lazy' if lazy else 'load'}): {' -> '.join(cycle)}"


def test_imports_run_down_the_layers():
  """step never imports multihost, loop or recipe; multihost never loop or recipe; loop never
  recipe; rollout never train; models never rollout or train; ... (function-level imports and
  lazy tables counted)."""
  graph = import_graph(_modules(), lazy=True)
  assert upward_imports(graph) == []
  assert "jaxrl_sys.rollout.types" in graph["jaxrl_sys.train.loop.rl_loop"]  # edges are seen
  assert "jaxrl_sys.rollout.setup.ray" in graph["jaxrl_sys.rollout.setup.factory"]  # registry


def test_a_planted_upward_import_fails_the_layer_check(tmp_path):
  """A function-level import of the loop from the step, in a copy of the package's layout on
  disk, and an edge from rollout to train in the real graph: both are reported."""
  for name, text in {"__init__.py": "", "train/__init__.py": "", "train/step/__init__.py": "",
                     "train/loop/__init__.py": "", "train/loop/rl_loop.py": "X = 1\n",
                     "train/step/update.py": "def f():\n  from jaxrl_sys.train.loop import "
                                             "rl_loop\n  return rl_loop.X\n"}.items():
    path = tmp_path / PACKAGE / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  planted = import_graph(_modules(tmp_path), lazy=True)
  assert import_graph(_modules(tmp_path))["jaxrl_sys.train.step.update"] == set()  # lazy only
  assert upward_imports(planted) == [("jaxrl_sys.train.step.update",
                                      "jaxrl_sys.train.loop.rl_loop")]
  graph = import_graph(_modules(), lazy=True)
  graph["jaxrl_sys.rollout.manager.core"].add("jaxrl_sys.train.recipe.build")
  assert upward_imports(graph) == [("jaxrl_sys.rollout.manager.core",
                                    "jaxrl_sys.train.recipe.build")]
  with pytest.raises(KeyError, match="in no layer"):
    layer_of("jaxrl_sys.newwing.module")


def test_manager_elastic_simulator_and_agents_import_without_jax():
  code = ("import sys, jaxrl_sys.sim, jaxrl_sys.rollout.manager, jaxrl_sys.rollout.elastic.offload,"
          " jaxrl_sys.rollout.elastic.fleet, jaxrl_sys.rollout.elastic.schedules,"
          " jaxrl_sys.rollout.workers, jaxrl_sys.rollout.weights, jaxrl_sys.rollout,"
          " jaxrl_sys.rollout.setup.spec, jaxrl_sys.agents\n"
          "from jaxrl_sys.rollout import RolloutManager, ManagerConfig, Request, WorkerLost\n"
          "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'flax')))\n"
          "assert not bad, bad[:5]\n"
          "from jaxrl_sys.rollout import Engine\n"  # the lazy attribute still resolves
          "assert 'jax' in sys.modules and Engine.__name__ == 'Engine'\n")
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, check=False)
  assert res.returncode == 0, res.stderr[-2000:]


def test_the_train_package_face_is_lazy():
  """Importing the step's config loads neither orbax, the loop, the recipe nor rollout."""
  code = ("import sys, jaxrl_sys.train.step.config\n"
          "bad = sorted(m for m in sys.modules if m.startswith(('orbax', 'jaxrl_sys.rollout',"
          " 'jaxrl_sys.train.loop', 'jaxrl_sys.train.recipe')))\n"
          "assert not bad, bad[:5]\n"
          "from jaxrl_sys.train import RLLoop\n"  # the lazy name still resolves
          "assert 'jaxrl_sys.train.loop.rl_loop' in sys.modules and RLLoop.__name__ == 'RLLoop'\n")
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, check=False)
  assert res.returncode == 0, res.stderr[-2000:]

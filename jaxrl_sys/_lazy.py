"""Lazy package attributes, shared by the package faces (`rollout`, `rollout.workers`, `train`):
`from jaxrl_sys.rollout import Engine` imports the engine (and JAX) only when the name is asked
for, so importing the manager or the simulator stays numpy-only, and importing
`jaxrl_sys.train.step.config` loads neither orbax nor the rollout wings."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_attributes(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any],
                                                                   Callable[[], list[str]]]:
  """`(__getattr__, __dir__)` for `package`: `names` maps an attribute to the module (absolute
  name) it is imported from on first access; the value is then cached in the package."""

  def getattr_(name: str) -> Any:
    module = names.get(name)
    if module is None:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    setattr(importlib.import_module(package), name, value)
    return value

  def dir_() -> list[str]:
    return sorted(set(vars(importlib.import_module(package))) | set(names))

  return getattr_, dir_

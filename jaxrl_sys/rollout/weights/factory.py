"""Weight stores by name: `make_weight_store("memory" | "ray" | "tensorstore:PATH_OR_URL")`.

Backends are registered as `name -> "module:Class"` and imported only when asked for (Ray and
tensorstore are heavy optional imports), so no store module imports another and the protocol
module (`weights.base`) imports no backend.
"""
from __future__ import annotations

import importlib

from jaxrl_sys.rollout.weights.base import WeightStore

# name -> (module:class, whether the spec carries an argument after "name:")
BACKENDS: dict[str, tuple[str, bool]] = {
    "memory": ("jaxrl_sys.rollout.weights.memory:MemoryWeightStore", False),
    "ray": ("jaxrl_sys.rollout.weights.ray:RayWeightStore", False),
    "tensorstore": ("jaxrl_sys.rollout.weights.tensorstore:TensorstoreWeightStore", True),
}


def _usage(spec: str) -> str:
  return (f"unknown weight store {spec!r}: use 'memory', 'ray' or 'tensorstore:PATH_OR_URL' (a "
          "directory, file://, gs:// or memory:// URL)")


def check_spec(spec: str) -> tuple[str, str, bool]:
  """(backend target, argument, takes an argument) of a weight store flag value; imports
  nothing, so a run checks its flag before starting Ray.

  Raises:
    ValueError: an unknown store, or an argument missing or extra (naming the forms).
  """
  name, sep, arg = spec.partition(":")
  entry = BACKENDS.get(name)
  if entry is None:
    raise ValueError(_usage(spec))
  target, takes_arg = entry
  if takes_arg != bool(sep and arg) or (sep and not takes_arg):
    raise ValueError(_usage(spec))
  return target, arg, takes_arg


def make_weight_store(spec: str) -> WeightStore:
  """A weight store from a flag value: "memory", "ray", or "tensorstore:PATH_OR_URL" (e.g.
  "tensorstore:/scratch/run1/weights", "tensorstore:gs://bucket/run1/weights")."""
  target, arg, takes_arg = check_spec(spec)
  module, cls = target.split(":")
  store_cls = getattr(importlib.import_module(module), cls)
  return store_cls(arg) if takes_arg else store_cls()

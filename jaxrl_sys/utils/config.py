"""Strict construction of frozen config dataclasses from plain dicts (JSON, flags).

Unknown keys are an error that names them, never silently dropped.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def _field_types(cls) -> dict[str, Any]:
  hints = typing.get_type_hints(cls)
  return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def _coerce(tp, value):
  origin = typing.get_origin(tp)
  args = typing.get_args(tp)
  if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
    return config_from_dict(tp, value)
  if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
    for a in args:
      if dataclasses.is_dataclass(a) and isinstance(value, Mapping):
        return config_from_dict(a, value)
    return value
  if origin is tuple and isinstance(value, list):
    return tuple(value)
  return value


def config_from_dict(cls: type[T], d: Mapping[str, Any]) -> T:
  """Builds the frozen dataclass `cls` from `d`; raises ValueError naming unknown keys."""
  if not dataclasses.is_dataclass(cls):
    raise TypeError(f"{cls!r} is not a dataclass")
  types = _field_types(cls)
  unknown = sorted(set(d) - set(types))
  if unknown:
    raise ValueError(
        f"unknown config key(s) for {cls.__name__}: {unknown}; known keys: {sorted(types)}")
  kwargs = {k: _coerce(types[k], v) for k, v in d.items()}
  return cls(**kwargs)


def config_to_dict(cfg) -> dict[str, Any]:
  """Inverse of `config_from_dict` (nested dataclasses become dicts, tuples stay tuples)."""
  return dataclasses.asdict(cfg)


def replace_config(cfg: T, **overrides) -> T:
  """`dataclasses.replace` that names unknown keys in its error."""
  names = {f.name for f in dataclasses.fields(cfg)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise ValueError(f"unknown config key(s) for {type(cfg).__name__}: {unknown}")
  return dataclasses.replace(cfg, **overrides)

"""`--config=FILE`: run settings from YAML or JSON, the same tree as `RunConfig`.

A run's `config.json` holds its settings as the nested tree (`{"loop": {"steps": 100, ...},
...}`), so `--config=runs/<run>/config.json` repeats the run (flags given on the command line
win over the file). A file may also name settings flat, by their flag names: the short ones
(`steps: 60`, as older config.json files and examples/grpo_sums.yaml do) or dotted ones
(`loop.steps: 60`). Output locations (the `output` section and `checkpoint.directory`) are
not written, so a repeated run gets its own directory.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Iterable, Mapping

from jaxrl_sys.train.recipe.run_config import ALIASES, resolve, sections, setting_paths

# Settings that say where a run writes, not what it computes (short names).
LOCATION_KEYS = ("out_dir", "checkpoint_dir", "export_hf", "overwrite", "progress")
LOCATION_PATHS = tuple(ALIASES[k] for k in LOCATION_KEYS)


def read_config_file(path: str) -> dict[str, Any]:
  """The mapping in a .yaml / .yml / .json file.

  Raises:
    ValueError: missing file, parse error, or a top level that is not a mapping.
  """
  if not os.path.isfile(path):
    raise ValueError(f"--config={path}: no such file")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  try:
    if path.endswith((".yaml", ".yml")):
      import yaml  # pylint: disable=import-outside-toplevel
      data = yaml.safe_load(text)
    else:
      data = json.loads(text)
  except Exception as e:  # yaml.YAMLError / json.JSONDecodeError
    raise ValueError(f"--config={path}: cannot parse it: {e}") from e
  if data is None:
    return {}
  if not isinstance(data, dict):
    raise ValueError(f"--config={path}: expected a mapping of flag names to values, got "
                     f"{type(data).__name__}")
  return data


def check_keys(data: Mapping[str, Any], known: Iterable[str], path: str) -> None:
  """Raises ValueError naming every unknown key (with the closest known name)."""
  known = sorted(known)
  bad = []
  for key in data:
    if key not in known:
      close = difflib.get_close_matches(key, known, n=1)
      bad.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
  if bad:
    raise ValueError(f"--config={path}: unknown key(s) {', '.join(bad)}; the keys are the flag "
                     "names of python -m experiments.grpo --help (short or section.field), or "
                     "sections of them")


def flat_settings(data: Mapping[str, Any], path: str = "FILE") -> dict[str, Any]:
  """{"section.field": value} of a config file's mapping: nested sections, dotted names and
  short names alike.

  Raises:
    ValueError: an unknown key (named, with the closest known one), or a setting given twice.
  """
  flat: dict[str, Any] = {}
  for key, value in data.items():
    if key in sections() and isinstance(value, Mapping):
      flat.update({f"{key}.{k}": v for k, v in value.items()})
    else:
      flat[key] = value
  check_keys(flat, list(ALIASES) + setting_paths(), path)
  out: dict[str, Any] = {}
  for key, value in flat.items():
    name = resolve(key)
    if name in out and out[name] != value:
      raise ValueError(f"--config={path}: {name} is given twice ({out[name]!r} and {value!r})")
    out[name] = value
  return out


def reproducible(config: Any) -> dict[str, Any]:
  """What config.json records: the settings of a run without its output locations.

  Args:
    config: a `RunConfig` (-> the nested tree of its settings), a `RecipeConfig`, or a flat
      mapping of short names (-> the same mapping).
  """
  if hasattr(config, "run_config"):
    config = config.run_config()
  if hasattr(config, "tree"):
    tree = config.tree()
    for path in LOCATION_PATHS:
      section, field = path.split(".")
      tree[section].pop(field, None)
    return {s: v for s, v in tree.items() if v}
  if dataclasses.is_dataclass(config):
    config = dataclasses.asdict(config)
  return {k: v for k, v in config.items() if k not in LOCATION_KEYS}


def short_names(data: Mapping[str, Any]) -> dict[str, Any]:
  """A config file's settings keyed by their flag names: the short name where there is one
  ("steps"), else "section.field" (the flat form older config.json files used)."""
  short = {path: name for name, path in ALIASES.items()}
  return {short.get(path, path): value for path, value in flat_settings(data).items()}

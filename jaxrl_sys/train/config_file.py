"""`--config=FILE`: run settings from YAML or JSON, with the same keys as the flags.

The `config.json` a run writes into its directory has exactly these keys, so
`--config=runs/<run>/config.json` repeats the run (flags given on the command line win over the
file). Output locations (`out_dir`, `checkpoint_dir`, `export_hf`, `overwrite`) are not written,
so a repeated run gets its own directory.
"""
from __future__ import annotations

import difflib
import json
import os
from typing import Any, Iterable, Mapping

# RecipeConfig fields that say where a run writes, not what it computes.
# Where a run writes and how this launch is placed (the processes of a multi-process job:
# the run is the same whatever their number), not what it trains.
LOCATION_KEYS = ("out_dir", "checkpoint_dir", "export_hf", "overwrite", "progress",
                 "coordinator_address", "num_processes", "process_id", "local_device_ids",
                 "distributed_timeout")


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
                     "names of python -m experiments.grpo --help")


def reproducible(config: Mapping[str, Any]) -> dict[str, Any]:
  """The settings of a run without its output locations (what config.json records)."""
  return {k: v for k, v in config.items() if k not in LOCATION_KEYS}

"""`--config=FILE`: run settings from YAML or JSON, with the same keys as the flags.

The `config.json` a run writes into its directory has exactly these keys, so
`--config=runs/<run>/config.json` repeats the run (flags given on the command line win over the
file). Output locations (`out_dir`, `checkpoint_dir`, `export_hf`, `overwrite`) are not written,
so a repeated run gets its own directory.

config.json also keeps the run's `history`: one entry per call (the fresh start, then each
`--resume`), with its start time and the settings it changed from the call before, so a run
resumed with another `--learning_rate` says so. The top-level keys are the latest call's
settings; `history` is not a setting and is ignored when the file is read back with --config.
"""
from __future__ import annotations

import difflib
import json
import os
import time
from typing import Any, Iterable, Mapping

# RecipeConfig fields that say where a run writes, not what it computes.
LOCATION_KEYS = ("out_dir", "checkpoint_dir", "export_hf", "overwrite", "progress")
HISTORY_KEY = "history"


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
  data.pop(HISTORY_KEY, None)  # a run's record of its calls, not a setting
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


def settings_history(path: str, settings: Mapping[str, Any], *, resume: bool
                     ) -> tuple[list[dict], dict[str, tuple[Any, Any]]]:
  """The `history` to write into the run's config.json at `path`, and the settings this call
  changes from the previous one ({key: (old, new)}; empty for a fresh run).

  A fresh run starts a new history; a resumed one appends an entry listing what it changed
  (an older config.json without history gets an entry for its own call first).
  """
  now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
  entry: dict[str, Any] = {"call": 1, "started": now, "resume": bool(resume)}
  if not (resume and os.path.exists(path)):
    return [entry], {}
  try:
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
  except (OSError, ValueError):
    old = None
  if not isinstance(old, dict):
    return [dict(entry, note=f"the previous {os.path.basename(path)} was unreadable")], {}
  history = [h for h in old.pop(HISTORY_KEY, None) or [] if isinstance(h, dict)]
  if not history:
    history = [{"call": 1, "started": None, "resume": False}]
  new = {k: v for k, v in settings.items() if k != HISTORY_KEY}
  changed = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
             if old.get(k) != new.get(k)}
  entry.update(call=len(history) + 1, changed={k: list(v) for k, v in changed.items()})
  return history + [entry], changed


class WriteOnce:
  """An `RLLoop` step hook that writes `data` as JSON to `path` at the first step it sees."""

  def __init__(self, path: str, data: Mapping[str, Any]):
    self.path, self.data, self.done = path, data, False

  def __call__(self, step: int, state: Any, row: dict) -> None:
    del step, state, row
    if not self.done:
      from jaxrl_sys.train.run_dir import write_json  # pylint: disable=import-outside-toplevel
      write_json(self.path, dict(self.data))
      self.done = True

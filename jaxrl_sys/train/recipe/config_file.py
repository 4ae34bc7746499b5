"""`--config=FILE`: run settings from YAML or JSON, the same tree as `RunConfig`.

A run's `config.json` holds its settings as the nested tree (`{"loop": {"steps": 100, ...},
...}`), so `--config=runs/<run>/config.json` repeats the run (flags given on the command line
win over the file). A file may also name settings flat, by their flag names: the short ones
(`steps: 60`, as older config.json files and examples/grpo_sums.yaml do) or dotted ones
(`loop.steps: 60`). Output locations (the `output` section and `checkpoint.directory`) and
the launch placement of a multi-process job (`distributed.*` but the mesh) are not written,
so a repeated run gets its own directory and may use another number of processes.


config.json also keeps the run's `history`: one entry per call (the fresh start, then each
`--resume`), with its start time and the settings it changed from the call before, so a run
resumed with another `--learning_rate` says so. The other keys are the latest call's settings;
`history` is not a setting and is ignored when the file is read back with --config.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import time
import typing
from typing import Any, Iterable, Mapping

from jaxrl_sys.train.recipe.run_config import (ALIASES, resolve, sections, setting_names,
                                               setting_paths)

# Settings that say where a run writes and how this launch is placed (the processes of a
# multi-process job: the run is the same whatever their number), not what it computes (short
# names).
LOCATION_KEYS = ("out_dir", "checkpoint_dir", "export_hf", "export_peft", "overwrite", "progress",
                 "coordinator_address", "num_processes", "process_id", "local_device_ids",
                 "distributed_timeout")
LOCATION_PATHS = tuple(ALIASES[k] for k in LOCATION_KEYS)
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
    if key == HISTORY_KEY:  # config.json's record of earlier calls, not a setting
      continue
    if key in sections() and (isinstance(value, Mapping) or key not in ALIASES):
      if not isinstance(value, Mapping):  # a section name (that is no short flag) holding a value
        raise ValueError(f"--config={path}: {key!r} is a section, a mapping of its settings "
                         f"(e.g. {key}: {{{setting_names(sections()[key])[0]}: ...}}), not "
                         f"{value!r}")
      flat.update({f"{key}.{k}": v for k, v in value.items()})
    else:
      flat[key] = value
  check_keys(flat, list(ALIASES) + setting_paths(), path)
  out: dict[str, Any] = {}
  for key, value in flat.items():
    name = resolve(key)
    if name in out and out[name] != value:
      raise ValueError(f"--config={path}: {name} is given twice ({out[name]!r} and {value!r})")
    if value is None and not _nullable(name):
      raise ValueError(f"--config={path}: {name} is null, and it needs a value; give one, or "
                       "leave the key out for its default")
    out[name] = value
  return out


def _nullable(path: str) -> bool:
  """Whether setting `path` ("section.field") may be None (its type is `X | None`)."""
  section, field = path.split(".")
  hint = typing.get_type_hints(sections()[section])[field]
  return type(None) in typing.get_args(hint)


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


def flatten(tree: Mapping[str, Any]) -> dict[str, Any]:
  """{"section.field": value} of a nested settings tree (`reproducible`'s)."""
  return _flat(tree)


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def settings_history(path: str, settings: Mapping[str, Any], *, resume: bool
                     ) -> tuple[list[dict], dict[str, tuple[Any, Any]]]:
  """The `history` to write into the run's config.json at `path`, and the settings this call
  changes from the previous one ({"section.field": (old, new)}; empty for a fresh run).

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
  before = _flat(old)
  after = _flat({k: v for k, v in settings.items() if k != HISTORY_KEY})
  changed = {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
             if before.get(k) != after.get(k)}
  entry.update(call=len(history) + 1, changed={k: list(v) for k, v in changed.items()})
  return history + [entry], changed


class WriteOnce:
  """An `RLLoop` step hook that writes `data` as JSON to `path` at the first step it sees."""

  def __init__(self, path: str, data: Mapping[str, Any]):
    self.path, self.data, self.done = path, data, False

  def __call__(self, step: int, state: Any, row: dict) -> None:
    del step, state, row
    if not self.done:
      from jaxrl_sys.train.recipe.run_dir import write_json  # pylint: disable=import-outside-toplevel
      write_json(self.path, dict(self.data))
      self.done = True

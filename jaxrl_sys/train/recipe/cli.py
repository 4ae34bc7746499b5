"""Flags generated from the config tree: `--section.field` for every setting of `RunConfig`,
its help the field's docstring, its default the `RunConfig()` default, plus the short names
of `run_config.ALIASES` as absl aliases (`--steps` sets `--loop.steps`).

    define_flags(FLAGS)                      # once, at import of the experiment
    config = run_config_from_flags(FLAGS)    # after parsing (and --config=FILE)
"""
from __future__ import annotations

import functools
import re

from absl import flags

from jaxrl_sys.train.recipe import config_file
from jaxrl_sys.train.recipe.run_config import (ALIASES, RunConfig, field_types, from_settings,
                                               sections, setting_names)

_DEFINE = {str: flags.DEFINE_string, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           bool: flags.DEFINE_bool}
_ENTRY = re.compile(r"^    ([A-Za-z_][\w, ]*?):\s*(.*)$")


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
  """{field: its documentation} from the `Attributes:` section of `cls`'s docstring (Google
  style: `name: text`, continuation lines indented further; `a, b: text` documents both)."""
  lines = (cls.__doc__ or "").splitlines()
  out: dict[str, str] = {}
  try:
    start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
  except StopIteration:
    return out
  names: list[str] = []
  for line in lines[start + 1:]:
    if not line.strip():
      break
    m = _ENTRY.match(line)
    if m:
      names = [n.strip() for n in m.group(1).split(",")]
      for n in names:
        out[n] = m.group(2).strip()
    elif line.startswith("      ") and names:
      for n in names:
        out[n] += " " + line.strip()
    else:
      break
  return out


def flag_help(section: str, field: str) -> str:
  """The help of `--section.field`: the field's documentation (ValueError if it has none)."""
  doc = attribute_docs(sections()[section]).get(field)
  if not doc:
    raise ValueError(f"{sections()[section].__name__}.{field} has no docstring: document it "
                     "under `Attributes:` in its class (it becomes the flag's help)")
  return doc


def define_flags(flag_values: flags.FlagValues = flags.FLAGS,
                 module_name: str | None = None) -> None:
  """Defines `--section.field` for every setting and the short aliases.

  Args:
    flag_values: where to define them.
    module_name: the module they are listed under in `--help` (absl lists the main module's;
      None: this one's, shown by `--helpfull` only).
  """
  defaults = RunConfig()
  for section, cls in sections().items():
    types = field_types(cls)
    for field in setting_names(cls):
      kind = types[field]
      _DEFINE[kind](f"{section}.{field}", getattr(getattr(defaults, section), field),
                    flag_help(section, field), flag_values=flag_values,
                    module_name=module_name)
  for short, path in ALIASES.items():
    flags.DEFINE_alias(short, path, flag_values=flag_values, module_name=module_name)


def setting_flags() -> list[str]:
  """The generated flag names ("loop.steps", ...), aliases not included."""
  return [f"{s}.{f}" for s, cls in sections().items() for f in setting_names(cls)]


def apply_config_file(path: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Sets every setting the file names that the command line did not set."""
  values = config_file.flat_settings(config_file.read_config_file(path), path)
  for name, value in values.items():
    flag = flag_values[name]
    if flag.present:
      continue
    try:
      if value is None:
        flag.value = None
      else:
        flag.parse(value)
    except (flags.IllegalFlagValueError, ValueError, TypeError) as e:
      raise ValueError(f"--config={path}: bad value {value!r} for {name!r}: {e}") from e


def check_flag_names(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Raises ValueError when the command line sets one setting under two names (`--steps=2
  --loop.steps=3`: absl would let the later win without a word). The same name twice is an
  override, as in any absl program."""
  for short, path in ALIASES.items():
    if short not in flag_values or path not in flag_values:
      continue
    alias, full = flag_values[short].present, flag_values[path].present
    if alias and full > alias:
      raise ValueError(f"--{short} and --{path} both set {path} (they are one setting): give "
                       "it once")


def run_config_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> RunConfig:
  """The validated `RunConfig` of the parsed flags.

  Raises:
    ValueError: a setting given under two names, or a value a section rejects.
  """
  check_flag_names(flag_values)
  return from_settings({name: flag_values[name].value for name in setting_flags()})


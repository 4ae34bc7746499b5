"""Prompt data sets as users bring them: JSONL (always), Parquet and `datasets` directories
(when `pyarrow` / `datasets` are installed), scored by a user reward function.

    task = DatasetTask.from_file("prompts.jsonl", reward="mymod:score")

Each row is a JSON object (a key given twice in one object is an error; a leading UTF-8 byte-order
mark is skipped) with a prompt field (default "prompt") and any other fields; they are
passed to the reward as keyword arguments: `score(prompt, completion, **row)`. An "answer" field
(default name) enables the supervised warm-up and the default `exact_match` reward. Problem
`i` is row `perm_e[i mod n]` where `perm_e` is a seeded permutation per epoch `e = i // n`, so
the data order is a pure function of the index (what checkpoints and resumption rely on).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_sys.tasks.base import Problem
from jaxrl_sys.tasks.rewards import exact_match, load_reward

# `--task=FORMAT:PATH` prefixes.
FORMATS = ("jsonl", "parquet", "datasets")


class RepeatedKeyError(ValueError):
  """A JSON object names one key twice (`json` would keep the last value silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
  """`json` object hook: the object, refusing a key given twice."""
  out: dict = {}
  for key, value in pairs:
    if key in out:
      raise RepeatedKeyError(f"the key {key!r} appears twice in one object ({out[key]!r:.40} "
                             f"and {value!r:.40}); JSON keeps only the last: remove one")
    out[key] = value
  return out


def _loads(text: str) -> Any:
  return json.loads(text, object_pairs_hook=_unique_keys)


def _read_jsonl(path: str) -> list[dict]:
  rows = []
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    line = raw.count(b"\n", 0, e.start) + 1
    raise ValueError(f"{path} line {line} (byte {e.start}): not UTF-8 text ({e.reason}); save "
                     "the file as UTF-8") from None
  text = text.removeprefix("\ufeff")  # a byte-order mark (Windows tools write one): not data
  if text.lstrip().startswith("["):  # a JSON array of objects
    try:
      data = _loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e})") from e
    except RepeatedKeyError as e:
      raise ValueError(f"{path}: {e}") from None
    return list(data)
  for n, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      rows.append(_loads(line))
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} line {n}: not a JSON object ({e.msg}): {line[:80]!r}") from e
    except RepeatedKeyError as e:
      raise ValueError(f"{path} line {n}: {e}") from None
  return rows


def _read_parquet(path: str) -> list[dict]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or convert "
                     "the file to JSONL") from e
  try:
    return pq.read_table(path).to_pylist()
  except Exception as e:  # pylint: disable=broad-except  (pyarrow's errors do not name the file)
    raise ValueError(f"{path}: cannot read it as Parquet ({type(e).__name__}: {e})") from None


def _read_datasets_dir(path: str) -> list[dict]:
  try:
    import datasets  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ValueError(f"{path}: reading a `datasets` directory needs the datasets package (pip "
                     "install datasets), or export it with Dataset.to_json(...)") from e
  ds = datasets.load_from_disk(path)
  if isinstance(ds, datasets.DatasetDict):
    if "train" not in ds:
      raise ValueError(f"{path}: a DatasetDict without a 'train' split ({list(ds)})")
    ds = ds["train"]
  return list(ds)


def read_rows(path: str, fmt: str | None = None) -> list[dict]:
  """The rows of a data file: `fmt` in FORMATS, or guessed from the path (.jsonl / .json,
  .parquet, a directory = `datasets.save_to_disk`).

  Raises:
    ValueError: missing file, unknown format, unreadable rows, or a row that is not an object.
  """
  if not os.path.exists(path):
    raise ValueError(f"data file {path} does not exist")
  if fmt is None:
    fmt = ("datasets" if os.path.isdir(path) else
           "parquet" if path.endswith(".parquet") else "jsonl")
  if fmt not in FORMATS:
    raise ValueError(f"unknown data format {fmt!r}; choose one of {FORMATS}")
  if fmt != "datasets" and os.path.isdir(path):
    raise ValueError(f"{fmt}:{path} is a directory; give the data file")
  rows = {"jsonl": _read_jsonl, "parquet": _read_parquet, "datasets": _read_datasets_dir}[fmt](
      path)
  for i, row in enumerate(rows):
    if not isinstance(row, dict):
      raise ValueError(f"{path}: row {i} is {type(row).__name__}, not an object with fields")
  if not rows:
    raise ValueError(f"{path}: no rows")
  return rows


class DatasetTask:
  """A task over prompt rows with a user reward (see the module docstring).

  Args:
    rows: the data rows (dicts).
    reward: a function `fn(prompt, completion, **row) -> float`, a "module:function" string,
      or None for `exact_match` on the answer field.
    prompt_key, answer_key: field names of the prompt and the optional reference answer.
    seed: seeds the per-epoch shuffles.
    name: shown in logs and plots.
  """

  def __init__(self, rows: Sequence[dict], reward: Callable[..., float] | str | None = None, *,
               prompt_key: str = "prompt", answer_key: str = "answer", seed: int = 0,
               name: str = "dataset"):
    self.rows = list(rows)
    if not self.rows:
      raise ValueError(f"task {name!r}: no rows")
    for i, row in enumerate(self.rows):
      if not isinstance(row.get(prompt_key), str):
        raise ValueError(f"task {name!r}: row {i} has no string field {prompt_key!r} (fields: "
                         f"{sorted(row)}); name the prompt field with prompt_key=...")
    self.prompt_key, self.answer_key, self.seed, self.name = prompt_key, answer_key, seed, name
    self.has_answers = all(row.get(answer_key) is not None for row in self.rows)
    if reward is None:
      if not self.has_answers:
        raise ValueError(f"task {name!r}: give a reward function (--reward=module:function); "
                         f"the default exact match needs an {answer_key!r} field in every row")
      reward = exact_match if answer_key == "answer" else (
          lambda prompt, completion, **row: exact_match(prompt, completion,
                                                        answer=row.get(answer_key)))
    self.reward_fn = load_reward(reward) if isinstance(reward, str) else reward
    if not callable(self.reward_fn):
      raise ValueError(f"task {name!r}: reward must be callable or 'module:function'")
    self._perms: dict[int, np.ndarray] = {}

  @classmethod
  def from_file(cls, path: str, reward: Callable[..., float] | str | None = None, *,
                fmt: str | None = None, **kwargs) -> "DatasetTask":
    """Reads `path` (see `read_rows`) into a task; kwargs as for the constructor."""
    kwargs.setdefault("name", os.path.basename(path.rstrip("/")))
    return cls(read_rows(path, fmt), reward, **kwargs)

  def __len__(self) -> int:
    return len(self.rows)

  def _row(self, index: int) -> dict:
    n = len(self.rows)
    epoch = index // n
    if epoch not in self._perms:
      if len(self._perms) > 64:
        self._perms.clear()
      self._perms[epoch] = np.random.default_rng([self.seed, epoch, 41]).permutation(n)
    return self.rows[int(self._perms[epoch][index % n])]

  def problem(self, index: int) -> Problem:
    row = self._row(int(index))
    answer = row.get(self.answer_key)
    return Problem(prompt=row[self.prompt_key], answer="" if answer is None else str(answer),
                   meta={"row": row})

  def reward(self, problem: Problem, completion: str) -> float:
    fields = {k: v for k, v in problem.meta["row"].items()
              if k not in (self.prompt_key, "completion")}
    return self.reward_fn(problem.prompt, completion, **fields)

  def select(self, keep: Sequence[int]) -> "DatasetTask":
    """The same task over the rows `keep` (indices into `rows`, in that order)."""
    kw = dict(prompt_key=self.prompt_key, answer_key=self.answer_key, seed=self.seed)
    return DatasetTask([self.rows[i] for i in keep], self.reward_fn, name=self.name, **kw)

  def split(self, num_eval: int) -> tuple["DatasetTask", "DatasetTask"]:
    """(train, held-out) tasks: the last `num_eval` rows are held out from training."""
    if not 0 < num_eval < len(self.rows):
      raise ValueError(f"task {self.name!r}: cannot hold out {num_eval} of {len(self.rows)} "
                       "rows for evaluation (lower --eval_prompts)")
    kw = dict(prompt_key=self.prompt_key, answer_key=self.answer_key, seed=self.seed)
    return (DatasetTask(self.rows[:-num_eval], self.reward_fn, name=self.name, **kw),
            DatasetTask(self.rows[-num_eval:], self.reward_fn, name=self.name + ":eval", **kw))

  def texts(self) -> list[str]:
    """Every prompt and answer string (e.g. to build a character vocabulary)."""
    out = []
    for row in self.rows:
      out.append(row[self.prompt_key])
      if row.get(self.answer_key) is not None:
        out.append(str(row[self.answer_key]))
    return out


def unknown_characters_note(task: DatasetTask, tokenizer: Any) -> str | None:
  """A note counting the rows whose prompt or answer holds text `tokenizer` does not know (it
  would become the tokenizer's unknown token: text the model cannot see), or None.

  `tokenizer` needs `unknown_characters(text) -> str` (`tasks.CharTokenizer`,
  `models.HFTokenizer`); without it there is nothing to check."""
  unknown = getattr(tokenizer, "unknown_characters", None)
  if unknown is None:
    return None
  rows, chars = [], {}
  for i, row in enumerate(task.rows):
    texts = [row[task.prompt_key]] + ([str(row[task.answer_key])]
                                      if row.get(task.answer_key) is not None else [])
    found = "".join(unknown(t) for t in texts)
    if found:
      rows.append(i)
      chars.update(dict.fromkeys(found))
  if not rows:
    return None
  shown = "".join(sorted(chars))
  unk = getattr(tokenizer, "unk_token", None)
  becomes = f"its unknown token {unk!r}" if unk else "its unknown token"
  return (f"{len(rows)} of {len(task.rows)} rows hold characters the model's tokenizer does not "
          f"know: {shown[:60]!r}{'...' if len(shown) > 60 else ''} (each becomes {becomes}, "
          f"which the model cannot read); e.g. row {rows[0]}: "
          f"{task.rows[rows[0]][task.prompt_key][:80]!r}. Use a model whose tokenizer covers "
          "the data, or rewrite the rows")


def parse_task_spec(spec: str) -> tuple[str, str] | None:
  """"jsonl:PATH" -> ("jsonl", PATH) for a data-set task, None for a built-in task name."""
  fmt, sep, path = spec.partition(":")
  if sep and fmt in FORMATS:
    if not path:
      raise ValueError(f"--task={spec}: give the data path after '{fmt}:'")
    return fmt, path
  return None


def make_dataset_task(spec: str, reward: str | Callable | None = None, **kwargs: Any
                      ) -> DatasetTask:
  """A `DatasetTask` from "FORMAT:PATH" (FORMAT in FORMATS) and a reward."""
  parsed = parse_task_spec(spec)
  if parsed is None:
    raise ValueError(f"--task={spec}: expected one of {[f + ':PATH' for f in FORMATS]}")
  fmt, path = parsed
  try:
    return DatasetTask.from_file(path, reward, fmt=fmt, **kwargs)
  except TypeError as e:
    raise ValueError(f"bad arguments for task {spec!r}: {e}") from e

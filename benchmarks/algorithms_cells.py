"""One run of `benchmarks.algorithms`: a cell (one configuration of the recipe) trained with one
seed through the public recipe API, or the MoE regime's pre-training (`algorithms_moe`); and
which runs of a previous results file `--merge` may reuse.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable

import numpy as np

from benchmarks.algorithms_moe import run_moe

@dataclasses.dataclass(frozen=True)
class Cell:
  """One configuration: `settings` for `RecipeConfig`, an optional task factory, loss-config
  overrides (applied to the built recipe), and whether to record each sample's length."""
  name: str
  settings: tuple
  task: Callable[[], Any] | None = None
  loss: tuple = ()
  lengths: bool = False


def cell(name, task=None, loss=None, lengths=False, **settings) -> Cell:
  return Cell(name, tuple(sorted(settings.items())), task, tuple(sorted((loss or {}).items())),
              lengths)


class LengthLog:
  """Wraps a task; records (reward, completion length in characters) of each scored sample."""

  def __init__(self, task):
    self.task, self.name, self.log = task, task.name, []

  def problem(self, index):
    return self.task.problem(index)

  def reward(self, problem, completion):
    r = self.task.reward(problem, completion)
    self.log.append((float(r), len(completion)))
    return r


class _Notes(logging.Handler):
  """Collects the run's collapse notes (the loop reports them through its progress log)."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.notes = []

  def emit(self, record):
    msg = record.getMessage()
    if msg.startswith("policy collapse"):
      self.notes.append(msg)


def run_cell(c: Cell, seed: int) -> dict:
  """Trains `c` with `seed`; returns its measures (scalars) and curves (lists)."""
  from jaxrl_sys.train.loop.collapse import collapse_onset  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.recipe import RecipeConfig, build_recipe, run_recipe  # pylint: disable=import-outside-toplevel
  settings = dict(c.settings)
  task = LengthLog(c.task()) if c.lengths else (c.task() if c.task else None)
  recipe = build_recipe(RecipeConfig(progress=False, seed=seed, **settings), task=task)
  if c.lengths:  # held-out prompts of the same task, unlogged: the length log is training's
    recipe.eval_task = c.task()
  if c.loss:  # a loss variant the flags do not offer (DAPO's clip range): nothing derives from it
    train = recipe.plan.train
    recipe.plan = dataclasses.replace(recipe.plan, train=dataclasses.replace(
        train, loss=dataclasses.replace(train.loss, **dict(c.loss))))
  logger = logging.getLogger("jaxrl_sys.train.loop.metrics_log")
  handler, level, propagate = _Notes(), logger.level, logger.propagate
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False  # the notes are collected here, not printed once per run
  t0 = time.perf_counter()
  try:
    hist = run_recipe(recipe, messages=False).run.history
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate
  curve = lambda k: [float(h.get(k, math.nan)) for h in hist]  # noqa: E731
  tail = max(len(hist) // 5, 1)
  onset = collapse_onset(hist)
  out = {"seed": seed, "seconds": time.perf_counter() - t0,
         "eval_reward": float(hist[-1].get("eval_reward", math.nan)),
         "reward_last": float(np.mean(curve("reward_mean")[-tail:])),
         "entropy_last": float(np.mean(curve("entropy")[-tail:])),
         "clip_frac_max": float(np.max(curve("clip_frac"))),
         "clip_frac_mean": float(np.mean(curve("clip_frac"))),
         "clip_frac_high_mean": float(np.mean(curve("clip_frac_high"))),
         "staleness_mean": float(np.mean(curve("staleness_mean"))),
         "lr_scale_mean": float(np.mean(curve("lr_scale"))),
         "collapse_step": None if onset is None else onset.index + 1,
         "collapse_notes": len(handler.notes),
         "entropy": curve("entropy"), "reward": curve("reward_mean"),
         "response_len": curve("response_len_mean"), "clip_frac": curve("clip_frac")}
  if c.lengths:
    log = np.asarray(task.log, np.float64).reshape(-1, 2)
    n = len(log) // 5
    first, last = log[:n], log[-n:]
    wrong = lambda part: float(part[part[:, 0] <= 0, 1].mean())  # noqa: E731
    right = lambda part: float(part[part[:, 0] > 0, 1].mean())  # noqa: E731
    out.update(incorrect_len_first=wrong(first), incorrect_len_last=wrong(last),
               correct_len_last=right(last), incorrect_len_drift=wrong(last) - wrong(first))
  return out


def fingerprint(c: Cell) -> str:
  """What a cell's runs depend on besides the seed (`--merge` reuses runs only when it
  matches)."""
  return repr((c.settings, c.loss, c.lengths))


def reusable(prev: dict | None, c: Cell, seeds: int) -> list | None:
  """The runs of `c` in a previous results payload, if they were made with the same settings
  and number of seeds; None otherwise."""
  if prev is None or len(prev["runs"].get(c.name, ())) != seeds:
    return None
  made = prev.get("cells", {}).get(c.name)  # files written before fingerprints: by name
  return prev["runs"][c.name] if made in (None, fingerprint(c)) else None


def run(c: Cell, seed: int) -> dict:
  settings = dict(c.settings)
  if settings.get("kind") == "moe":
    return run_moe(settings["balancing"], seed, settings["steps"], settings["batch"])
  return run_cell(c, seed)

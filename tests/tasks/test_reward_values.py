"""Reward values are checked in one place (`tasks.rewards.reward_value`): numbers that fit
float32 pass; anything else is a counted failure naming its type; NaN / inf stop the run."""
import numpy as np
import pytest

from jaxrl_sys import tasks
from jaxrl_sys.tasks import (CountingTask, DatasetTask, NonFiniteRewardError, RewardValueError,
                             reward_value)

ROWS = [{"prompt": f"q{i}", "answer": str(i)} for i in range(4)]


@pytest.mark.parametrize("value,expected", [
    (True, 1.0), (0, 0.0), (3, 3.0), (0.25, 0.25), (np.float64(-2.5), -2.5), (np.int32(7), 7.0),
    (np.bool_(True), 1.0), (np.array(0.5, np.float32), 0.5), (3.0e38, 3.0e38)])
def test_numbers_pass_unchanged(value, expected):
  got = reward_value(value, "t", "p", "c")
  assert type(got) is float and got == expected
  assert np.isfinite(np.float32(got))  # what the trainer stores


@pytest.mark.parametrize("value,message", [
    ("1.0", "returned str '1.0', not a number"), (None, "returned NoneType None, not a number"),
    ([1.0], "returned list [1.0], not a number"), (np.array([1.0]), "returned ndarray"),
    (1 + 2j, "returned complex"), (1e300, "returned float 1e+300, which does not fit float32"),
    (np.float64(-1e39), "does not fit float32"), (10**400, "returned int 1000"),
    (np.array("x"), "not a number")])
def test_non_rewards_are_named(value, message):
  with pytest.raises(RewardValueError) as e:
    reward_value(value, "t", "p", "c")
  assert message in str(e.value)


def test_counting_task_counts_every_kind_and_names_the_type():
  values = {"q0": "1.0", "q1": None, "q2": 1e300, "q3": 1.0}
  task = CountingTask(DatasetTask(ROWS, lambda prompt, completion, **row: values[prompt]))
  probs = [task.problem(i) for i in range(4)]
  rewards, errors = tasks.score_completions(task, probs, ["c"] * 4)
  by_prompt = {p.prompt: r for p, r in zip(probs, rewards)}
  assert by_prompt == {"q0": 0.0, "q1": 0.0, "q2": 0.0, "q3": 1.0}  # "1.0" is not coerced
  assert errors == []  # CountingTask already scored them 0: counted there, once each
  row = {}
  task.metrics_hook(1, None, row)
  assert row == {"reward_failures": 3.0, "reward_failure_frac": 0.75}
  note = task.summary()
  assert note.startswith("reward function failed on 3 of 4 completions (scored 0)")
  first = next(p.prompt for p in probs if p.prompt != "q3")  # the first failure in call order
  expected = {"q0": "str '1.0'", "q1": "NoneType None", "q2": "does not fit float32"}[first]
  assert "first: RewardValueError: returned" in note and expected in note


def test_plain_task_gets_the_same_check():
  class Stringly:
    name = "s"

    def reward(self, problem, completion):
      return completion

  probs = [tasks.Problem("a", "1"), tasks.Problem("b", "1")]
  rewards, errors = tasks.score_completions(Stringly(), probs, ["1.0", "0.5"])
  assert rewards.tolist() == [0.0, 0.0] and len(errors) == 2
  assert "RewardValueError: returned str '1.0'" in errors[0].message


def test_nan_and_inf_still_stop_the_run():
  task = CountingTask(DatasetTask(ROWS, lambda prompt, completion, **row: float("inf")))
  with pytest.raises(NonFiniteRewardError, match="returned inf for prompt"):
    task.reward(task.problem(0), "c")
  assert task.total_failures == 0


def test_a_reward_calling_sys_exit_is_a_counted_failure():
  """Issue 44: sys.exit(3) in a reward ended the run with exit 3 (the "diverged" code), no
  message and no checkpoint."""
  import sys  # pylint: disable=import-outside-toplevel

  def exits(prompt, completion, **row):
    sys.exit(3)

  task = CountingTask(DatasetTask(ROWS, exits))
  assert task.reward(task.problem(0), "c") == 0.0
  assert task.summary() == ("reward function failed on 1 of 1 completions (scored 0); first: "
                            f"SystemExit: 3 (prompt {task.problem(0).prompt!r}, completion 'c')")
  rewards, errors = tasks.score_completions(DatasetTask(ROWS, exits), [task.problem(1)], ["c"])
  assert rewards.tolist() == [0.0] and errors[0].message == "SystemExit: 3"

  def interrupted(prompt, completion, **row):
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):  # Ctrl-C stays an interrupt
    CountingTask(DatasetTask(ROWS, interrupted)).reward(task.problem(0), "c")

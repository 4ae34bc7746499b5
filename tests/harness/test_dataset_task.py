"""Data-set tasks, user reward functions, reward-failure counting (no training)."""
import json
import math
import sys

import numpy as np
import pytest

from jaxrl_sys import tasks
from jaxrl_sys.tasks import CountingTask, DatasetTask, NonFiniteRewardError, load_reward


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _module(tmp_path, monkeypatch, source, name="user_reward_mod"):
  (tmp_path / f"{name}.py").write_text(source)
  monkeypatch.syspath_prepend(str(tmp_path))
  sys.modules.pop(name, None)
  return name


def test_reward_spec_forms_and_errors(tmp_path, monkeypatch):
  mod = _module(tmp_path, monkeypatch, "def score(prompt, completion, **row):\n  return 2.0\n"
                "LIMIT = 3\n")
  assert load_reward(f"{mod}:score")("p", "c") == 2.0
  assert load_reward(f"{tmp_path / (mod + '.py')}:score")("p", "c") == 2.0
  for spec, message in [("nocolon", "expected module:function"),
                        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
                        (f"{mod}:nothere", "has no attribute 'nothere'"),
                        (f"{mod}:LIMIT", "'LIMIT' is not callable"),
                        ("missing/file.py:f", "no file")]:
    with pytest.raises(ValueError, match=message):
      load_reward(spec)


def test_rows_order_split_and_reward_arguments(tmp_path, monkeypatch):
  rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "level": i % 3} for i in range(10)]
  path = _write_jsonl(tmp_path / "d.jsonl", rows)
  mod = _module(tmp_path, monkeypatch, "SEEN = []\ndef score(prompt, completion, **row):\n"
                "  SEEN.append((prompt, completion, row))\n  return float(row['level'])\n")
  task = tasks.make_task(f"jsonl:{path}", f"{mod}:score", seed=5)
  # each epoch of 10 indices visits every row exactly once
  for epoch in range(3):
    seen = sorted(task.problem(epoch * 10 + i).prompt for i in range(10))
    assert seen == sorted(r["prompt"] for r in rows)
  p = task.problem(4)
  row = next(r for r in rows if r["prompt"] == p.prompt)
  assert task.reward(p, " x") == float(row["level"])
  assert sys.modules[mod].SEEN[-1] == (p.prompt, " x", {"answer": row["answer"],
                                                        "level": row["level"]})
  train, held = task.split(3)
  assert [r["prompt"] for r in held.rows] == [r["prompt"] for r in rows[-3:]]
  assert not {train.problem(i).prompt for i in range(50)} & {r["prompt"] for r in rows[-3:]}


def test_default_reward_is_exact_match_on_answers(tmp_path):
  task = DatasetTask.from_file(_write_jsonl(tmp_path / "d.jsonl",
                                            [{"prompt": "2+2=", "answer": 4}]))
  p = task.problem(0)
  assert task.reward(p, " 4 ") == 1.0 and task.reward(p, "5") == 0.0
  with pytest.raises(ValueError, match="give a reward function"):
    DatasetTask([{"prompt": "x"}])


def test_bad_data_is_named(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "a"}\n{"prompt": \n')
  with pytest.raises(ValueError, match="bad.jsonl line 2"):
    tasks.read_rows(str(bad))
  with pytest.raises(ValueError, match="row 0 has no string field 'prompt'"):
    DatasetTask([{"question": "q", "answer": "a"}])
  assert DatasetTask([{"question": "q", "answer": "a"}], prompt_key="question").problem(0).prompt \
      == "q"
  with pytest.raises(ValueError, match="does not exist"):
    tasks.make_task(f"jsonl:{tmp_path / 'none.jsonl'}")
  try:
    import pyarrow  # noqa: F401
  except ImportError:
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="needs pyarrow"):
      tasks.make_task(f"parquet:{tmp_path / 'd.parquet'}")


def test_failures_are_counted_and_nan_names_the_prompt(caplog):
  def score(prompt, completion, **row):
    if prompt.startswith("1"):
      raise KeyError("boom")
    return math.nan if prompt == "2+0=" else 1.0

  rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
  task = CountingTask(DatasetTask(rows, score))
  problems = [task.problem(i) for i in range(9)]
  ok = [p for p in problems if p.prompt != "2+0="]
  with caplog.at_level("WARNING"):
    rewards, _ = tasks.score_completions(task, ok, ["x"] * len(ok))
  expected_failures = sum(p.prompt.startswith("1") for p in ok)
  np.testing.assert_array_equal(rewards, [0.0 if p.prompt.startswith("1") else 1.0 for p in ok])
  row = {}
  task.metrics_hook(1, None, row)
  assert row["reward_failures"] == expected_failures == 3
  assert row["reward_failure_frac"] == pytest.approx(3 / 8)
  assert caplog.text.count("KeyError") == 1  # one line, not one per completion
  assert "failed on 3 of 8 completions" in task.summary()
  nan_problem = next(p for p in problems if p.prompt == "2+0=")
  with pytest.raises(NonFiniteRewardError, match=r"returned nan for prompt '2\+0='"):
    tasks.score_completions(task, [nan_problem], ["y"])

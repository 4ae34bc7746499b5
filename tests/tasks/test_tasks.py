"""Tasks, rewards, tokenizer and the safe scoring of failing reward functions."""
import logging
import re

import numpy as np
import pytest

from jaxrl_sys import tasks


def test_tokenizer_roundtrip_and_errors():
  tok = tasks.CharTokenizer()
  ids = tok.encode("12+7=19", bos=True, eos=True)
  assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
  assert tok.decode(ids) == "12+7=19"
  assert tok.decode(tok.encode("3") + [tok.eos_id] + tok.encode("9")) == "3"
  with pytest.raises(ValueError, match=r"not in the alphabet: \['€'\]"):
    tok.encode("1€")


def test_arithmetic_is_deterministic_and_correct():
  t = tasks.ArithmeticTask(num_digits=3, ops="+-*", seed=4)
  for i in range(200):
    p = t.problem(i)
    assert p == t.problem(i)
    m = re.fullmatch(r"(\d+)([-+*])(\d+)=", p.prompt)
    a, op, b = m.groups()
    want = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    assert int(p.answer) == want >= (0 if op == "-" else -10**9)
    assert t.reward(p, p.answer + "\nmore") == 1.0
    assert t.reward(p, str(want + 1)) == 0.0
  assert t.reward(t.problem(0), "") == 0.0


def test_arithmetic_filler_frees_the_length_only():
  plain, filled = tasks.ArithmeticTask(num_digits=1, ops="+"), tasks.ArithmeticTask(
      num_digits=1, ops="+", filler=8)
  pads = []
  for i in range(300):
    p, q = plain.problem(i), filled.problem(i)
    a, b = map(int, re.fullmatch(r"(\d)\+(\d)=", p.prompt).groups())
    assert q.prompt == p.prompt and p.answer == str(a + b)     # same problems, filler=0 as before
    assert q.answer.rstrip(" ") == p.answer and set(q.answer[len(p.answer):]) <= {" "}
    pads.append(len(q.answer) - len(p.answer))
    assert filled.reward(q, q.answer) == 1.0 == filled.reward(q, p.answer)
  # 0..8 spaces, each count drawn (uniform: every value appears in 300 draws)
  assert sorted(set(pads)) == list(range(9))
  with pytest.raises(ValueError, match="filler"):
    tasks.ArithmeticTask(filler=-1)


def test_countdown_reference_answers_score_one_and_cheats_zero():
  t = tasks.CountdownTask(count=4, max_number=9, seed=1)
  for i in range(100):
    p = t.problem(i)
    assert t.reward(p, p.answer) == 1.0
    # only 1 if the target is a given number
    assert t.reward(p, str(p.meta["target"])) in (0.0, 1.0)
    assert t.reward(p, "1+(") == 0.0
  p = tasks.Problem("2 3 4:14=", "", {"numbers": [2, 3, 4], "target": 14})
  assert t.reward(p, "2+3*4") == 1.0
  assert t.reward(p, "(2+3)*4") == 0.0   # 20
  assert t.reward(p, "2*7") == 0.0       # 7 is not given
  assert t.reward(p, "2+2+10") == 0.0    # 2 used twice


def test_evaluate_precedence_and_parentheses():
  assert tasks.evaluate("2+3*4-1")[0] == 13
  assert tasks.evaluate("(2+3)*(4-1)") == (15, [2, 3, 4, 1])
  with pytest.raises(ValueError):
    tasks.evaluate("2+")


@pytest.mark.parametrize("text,want", [
    ("so 3 apples ... #### 1,234", "1234"), ("The answer is $42.", "42"),
    ("\\boxed{7.50}", "7.5"), ("we get 3 then 5", "5"), ("no numbers", None), ("#### -3", "-3")])
def test_gsm8k_extractor(text, want):
  assert tasks.extract_gsm8k_answer(text) == want


def test_failing_reward_function_is_reported_and_scored_zero(caplog):
  class Bad:
    name = "bad"

    def reward(self, problem, text):
      if text == "boom":
        raise RuntimeError("kaput")
      return float("nan") if text == "nan" else 1.0

  probs = [tasks.Problem(f"q{i}", "") for i in range(4)]
  with caplog.at_level(logging.WARNING):
    r, errs = tasks.score_completions(Bad(), probs, ["ok", "boom", "ok", "boom"])
  np.testing.assert_array_equal(r, [1.0, 0.0, 1.0, 0.0])
  assert [e.index for e in errs] == [1, 3] and errs[0].prompt == "q1" and "kaput" in errs[0].message
  # one summary line, not one per completion
  assert len(caplog.records) == 1 and "failed on 2 of 4" in caplog.text and "q1" in caplog.text
  # a NaN reward is a bug in the reward function: an error naming the prompt
  with pytest.raises(tasks.NonFiniteRewardError, match="returned nan for prompt 'q2'"):
    tasks.score_completions(Bad(), probs, ["ok", "ok", "nan", "ok"])


def test_supervised_examples_masks():
  tok = tasks.CharTokenizer()
  t = tasks.ArithmeticTask(num_digits=1)
  b = tasks.supervised_examples(t, tok, 0, 4)
  for j in range(4):
    p = t.problem(j)
    n = int(b.attention_mask[j].sum())
    assert tok.decode(b.tokens[j, :n]) == p.prompt + p.answer
    targets = b.tokens[j, 1:][b.loss_mask[j, :-1] == 1]
    assert tok.decode(targets) == p.answer and targets[-1] == tok.eos_id


def test_make_task_errors():
  with pytest.raises(ValueError, match="unknown task 'chess'"):
    tasks.make_task("chess")
  with pytest.raises(ValueError, match="bad arguments for task 'arithmetic'"):
    tasks.make_task("arithmetic", digits=3)

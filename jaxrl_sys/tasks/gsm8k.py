"""Answer extraction for GSM8K-style completions of real checkpoints."""
from __future__ import annotations

import re

_NUM = r"-?\$?\d[\d,]*(?:\.\d+)?"


def _normalise(s: str) -> str:
  s = s.replace(",", "").replace("$", "").strip()
  if "." in s:
    s = s.rstrip("0").rstrip(".")
  return s


def extract_gsm8k_answer(text: str) -> str | None:
  """The final numeric answer: after '####', else inside \\boxed{}, else after 'answer is',
  else the last number in the text. Commas, '$' and trailing '.0' are removed."""
  m = re.search(r"####\s*(" + _NUM + ")", text)
  if m is None:
    m = re.search(r"\\boxed\{\s*(" + _NUM + r")\s*\}", text)
  if m is None:
    m = re.search(r"answer is\s*:?\s*(" + _NUM + ")", text, flags=re.IGNORECASE)
  if m is not None:
    return _normalise(m.group(1))
  nums = re.findall(_NUM, text)
  return _normalise(nums[-1]) if nums else None


def gsm8k_reward(reference: str, completion: str) -> float:
  """1.0 when the extracted answers of the reference solution and the completion agree."""
  ref = extract_gsm8k_answer(reference)
  got = extract_gsm8k_answer(completion)
  return float(ref is not None and got is not None and ref == got)

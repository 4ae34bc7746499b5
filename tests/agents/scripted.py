"""A scripted rollout session (no JAX): each turn request generates the tokens a script gives
for (episode, turn), `chunk` tokens per poll, with made-up log-probs that depend only on the
token's position, so a test knows every sampled token independently of the driver."""
import dataclasses
import time

import numpy as np

from jaxrl_sys.rollout.types import Completion, FinishReason, Request


class ScriptedSession:
  """A `RolloutSession` whose "engine" follows `script(episode_id, turn) -> list[int]` (the
  turn's tokens, stop token included when the turn ends on one).

  Args:
    script: the tokens of each turn.
    stop_ids: ids that end a turn.
    chunk: tokens generated per request and poll.
    poll_seconds: wall time one poll takes (a slow "device").
  """

  def __init__(self, script, stop_ids=(2,), chunk: int = 4, poll_seconds: float = 0.0,
               version: int = 0):
    self.script, self.stop_ids, self.chunk = script, tuple(stop_ids), chunk
    self.poll_seconds, self.version = poll_seconds, version
    self.running: dict[int, Request] = {}
    self.submitted: list[Request] = []
    self.done: list[Completion] = []

  def target(self, r: Request) -> list[int]:
    return list(self.script(int(r.meta["episode"]), int(r.meta["turn"])))[:r.max_new_tokens]

  def submit(self, requests):
    for r in requests:
      if r.request_id in self.running:
        raise ValueError(f"duplicate {r.request_id}")
      self.submitted.append(dataclasses.replace(r))
      self.running[r.request_id] = dataclasses.replace(r)

  @staticmethod
  def logprob(index: int) -> float:
    return -0.125 * (index + 1)

  def poll(self, min_count=0, timeout=None):
    if self.poll_seconds:
      time.sleep(self.poll_seconds)
    for rid, r in list(self.running.items()):
      want = self.target(r)
      n = r.num_generated
      new = want[n:n + self.chunk]
      r.extend(new, [self.logprob(i) for i in range(n, n + len(new))], self.version)
      ended = r.num_generated >= len(want) or (new and new[-1] in self.stop_ids)
      if ended:
        finish = (FinishReason.STOP if r.num_generated and int(r.tokens[-1]) in self.stop_ids
                  else FinishReason.LENGTH)
        self.done.append(Completion(self.running.pop(rid), finish))
    out, self.done = self.done, []
    return out

  def abort(self, request_ids=None):
    ids = list(self.running) if request_ids is None else [i for i in request_ids
                                                           if i in self.running]
    return [self.running.pop(i) for i in ids]

  def snapshot(self):
    return [dataclasses.replace(r) for r in self.running.values()]

  def publish(self, params, version, moe_state=None):
    self.version = version

  def num_pending(self):
    return len(self.running) + len(self.done)

  def metrics(self):
    return {"tokens": 0}

  def describe(self):
    return f"scripted: {len(self.running)} running"

  def close(self):
    pass


def run_all(driver, requests, timeout: float = 60.0):
  """Submits `requests` to `driver` and polls until every episode returned: id -> request."""
  driver.submit(requests)
  out, t0 = {}, time.monotonic()
  while driver.num_pending():
    for c in driver.poll(min_count=1, timeout=1.0):
      out[c.request_id] = c
    if time.monotonic() - t0 > timeout:
      raise TimeoutError(f"episodes not done: {driver.describe()}")
  return out


def episode_requests(task, tokenizer, count: int, budget: int, first: int = 0):
  """One request per problem `first ... first + count - 1` (ids = problem indices)."""
  out = []
  for i in range(first, first + count):
    prompt = tokenizer.encode(task.problem(i).prompt, bos=True)
    out.append(Request(i, prompt, budget, np.array([i, 1], np.uint32), group_id=i,
                       meta={"problem": i}))
  return out

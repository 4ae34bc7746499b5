"""The episode driver over a scripted session (no JAX): the token sequence, the mask, prefetch,
the fault list, resumption from a checkpointed snapshot, the turn barrier, the limits."""
import json
import threading
import time

import numpy as np
import pytest

from jaxrl_sys.agents import AgentConfig, EpisodeDriver
from jaxrl_sys.rollout.wire import request_from_json, request_to_json
from jaxrl_sys.tasks import CharTokenizer, SearchEnv, SearchTask
from jaxrl_sys.tasks.env import ToolEnv
from jaxrl_sys.tasks.tools import Tool
from jaxrl_sys.tasks.turns import PlainFormat
from jaxrl_sys.train.recipe.presets import MATH_CHARS
from tests.agents.scripted import ScriptedSession, episode_requests, run_all

TASK = SearchTask(num_entities=32, hops=2, seed=3)
TOK = CharTokenizer(MATH_CHARS + "".join(sorted(set(TASK.alphabet + "abcdefghijklmnopqrstuvwxyz?"
                                                     "<>") - set(MATH_CHARS))))
EOS = TOK.eos_id


def demo_script(task=TASK):
  """The expert's turns of each problem (episode id = problem index), eos-terminated."""
  def script(episode, turn):
    turns = [text for text, policy in task.demonstration(episode)[1:] if policy]
    return TOK.encode(turns[turn]) + [EOS]
  return script


def reference(task, episode):
  """The expected sequence after the prompt, written out by hand: each turn's text + eos, each
  observation "\\n" + text + "\\n"; mask 1 on the turns; turn-relative log-probs."""
  ids, mask, lps = [], [], []
  for text, policy in task.demonstration(episode)[1:]:
    if policy:
      turn = TOK.encode(text) + [EOS]
      ids += turn
      mask += [1] * len(turn)
      lps += [ScriptedSession.logprob(i) for i in range(len(turn))]
    else:
      obs = TOK.encode("\n" + text + "\n")
      ids += obs
      mask += [0] * len(obs)
      lps += [0.0] * len(obs)
  return np.array(ids), np.array(mask), np.array(lps, np.float32)


def make_driver(session, factory=None, task=TASK, **config):
  config.setdefault("check_template", False)
  return EpisodeDriver(session, factory or task.make_env, task, PlainFormat(TOK),
                       AgentConfig(**config))


def test_training_sequence_is_sampled_plus_observation_tokens():
  driver = make_driver(ScriptedSession(demo_script(), (EOS,), chunk=3), max_turns=4)
  out = run_all(driver, episode_requests(TASK, TOK, 6, 160))
  assert sorted(out) == list(range(6))
  for e, c in out.items():
    r = c.request
    ids, mask, lps = reference(TASK, e)
    np.testing.assert_array_equal(r.tokens, ids)
    np.testing.assert_array_equal(r.versions >= 0, mask.astype(bool))
    np.testing.assert_array_equal(r.versions[mask == 0], -1)
    np.testing.assert_allclose(r.logprobs, lps)
    assert r.meta["episode"]["reward"] == 1.0 and r.meta["episode"]["weight"] == 1.0
    assert r.meta["episode"]["turns"] == 3
  m = driver.metrics()
  assert m["agent_episodes_done"] == 6 and m["agent_tool_ok"] == 12
  assert m["agent_episode_success"] == 6
  driver.close()


class SlowSearchEnv(SearchEnv):
  """Search with 50 ms of latency per call (still read-only)."""

  def __init__(self, task):
    super().__init__(task)
    fast = self.tools[0]
    slow = Tool("search", lambda q: (time.sleep(0.05), fast.fn(q))[1], read_only=True)
    self.tools, self.by_name = (slow,), {"search": slow}


def test_prefetch_is_lossless_and_hits():
  results = {}
  for prefetch in (False, True):
    session = ScriptedSession(demo_script(), (EOS,), chunk=2, poll_seconds=0.005)
    driver = make_driver(session, lambda: SlowSearchEnv(TASK), prefetch=prefetch)
    t0 = time.monotonic()
    out = run_all(driver, episode_requests(TASK, TOK, 8, 160))
    results[prefetch] = (out, driver.metrics(), time.monotonic() - t0)
    driver.close()
  (off, m_off, _), (on, m_on, _) = results[False], results[True]
  for e in off:
    np.testing.assert_array_equal(off[e].request.tokens, on[e].request.tokens)
    np.testing.assert_array_equal(off[e].request.versions, on[e].request.versions)
    assert off[e].request.meta["episode"]["reward"] == on[e].request.meta["episode"]["reward"]
  assert m_on["agent_prefetch_hits"] > 0 and m_on["agent_prefetch_seconds_saved"] > 0
  assert "agent_prefetch_hits" not in m_off


def _tools():
  def ok(x):
    return f"ok {x}"

  def boom(x):
    raise ZeroDivisionError(f"boom {x}")

  def hang(x):
    time.sleep(3)
    return "late"

  def big(x):
    return "z" * (10 * 2 ** 20)

  def bad(x):
    return b"ab\xff\xfecd"

  return tuple(Tool(f.__name__, f, read_only=f is ok) for f in (ok, boom, hang, big, bad))


class FaultEnv(ToolEnv):
  """Tools that misbehave; an action "crash" makes `step` itself raise."""
  tools = _tools()

  def score(self, problem, answer):
    return float(answer == "done")

  def step(self, action):
    if action.text == "crash":
      raise RuntimeError("the env broke")
    return super().step(action)


FAULTS = {0: ["<<ok a>>", "done"], 1: ["<<boom x>>", "done"], 2: ["<<hang x>>", "done"],
          3: ["<<big x>>", "done"], 4: ["<<bad x>>", "done"], 5: ["<<ok a", "done"],
          6: ["crash"], 7: ["<<nosuch a>>", "done"], 8: ["<< >>", "done"]}


def test_fault_list_becomes_metrics_and_nothing_is_lost():
  script = lambda e, t: TOK.encode(FAULTS[e][t]) + [EOS]  # noqa: E731
  driver = make_driver(ScriptedSession(script, (EOS,)), FaultEnv, tool_timeout=0.3,
                       tool_output_chars=4096, prefetch=False)
  out = run_all(driver, episode_requests(TASK, TOK, len(FAULTS), 200))
  assert sorted(out) == sorted(FAULTS)  # every episode came back
  m = driver.metrics()
  assert m["agent_tool_ok"] == 3      # ok, big (cut), bad (replaced)
  assert m["agent_tool_error"] == 1 and m["agent_tool_timeout"] == 1
  assert m["agent_tool_unclosed"] == 1 and m["agent_tool_unknown"] == 1
  assert m["agent_tool_malformed"] == 1
  assert m["agent_tool_truncated"] == 1 and m["agent_tool_bad_utf8"] == 1
  assert m["agent_env_errors"] == 1 and m["agent_episodes_truncated"] == 1
  ep = {e: c.request.meta["episode"] for e, c in out.items()}
  assert ep[6]["weight"] == 0.0 and "the env broke" in ep[6]["env_error"]
  assert ep[3]["weight"] == 0.0 and ep[3]["truncated"]      # 4 kB observation > the budget
  assert len(out[3].request.tokens) == 200
  for e in (0, 1, 2, 4, 5, 7, 8):
    assert ep[e]["reward"] == 1.0 and ep[e]["weight"] == 1.0 and ep[e]["turns"] == 2
  obs = {e: TOK.decode(c.request.tokens[c.request.versions < 0]) for e, c in out.items()}
  assert "ok a" in obs[0] and "boom x" in obs[1] and "timed out" in obs[2]
  assert "ab??cd" in obs[4] and "never closed" in obs[5] and "unknown tool" in obs[7]
  driver.close()


class GatedEnv(SlowSearchEnv):
  """Episode 0's tool calls wait for `GATE`: it stays in a tool call while the others run."""
  GATE = threading.Event()

  def step(self, action):
    if self.problem.prompt == TASK.problem(0).prompt:
      assert self.GATE.wait(30)
    return super().step(action)


def test_checkpointed_snapshot_resumes_exactly():
  reqs = episode_requests(TASK, TOK, 6, 160)
  assert len({TASK.problem(i).prompt for i in range(6)}) == 6

  def fresh():  # turns take a few 5 ms polls, tool calls 50 ms
    return make_driver(ScriptedSession(demo_script(), (EOS,), chunk=2, poll_seconds=0.005),
                       lambda: GatedEnv(TASK), prefetch=False)
  GatedEnv.GATE.set()
  undisturbed = run_all(fresh(), reqs)
  GatedEnv.GATE.clear()
  driver = fresh()
  driver.submit(reqs)
  got, deadline = {}, time.monotonic() + 30

  def mid_turn():  # another episode holds sampled tokens of an unfinished turn
    held = {r.request_id: r.num_generated for r in driver.session.snapshot()}
    return any(held.get(ep.turn_id, 0) > 0 and ep.turn > 0 for ep in driver.episodes.values())
  # Checkpoint while episode 0 waits in a tool call and another is mid-turn.
  while not (driver.episodes[0].phase == "env" and driver.episodes[0].turn > 0 and mid_turn()):
    for c in driver.poll(min_count=1, timeout=0.005):
      got[c.request_id] = c
    assert 0 in driver.episodes and time.monotonic() < deadline
  saved = json.loads(json.dumps([request_to_json(r) for r in driver.snapshot()]))
  GatedEnv.GATE.set()
  driver.abort()
  states = [(r["meta"]["episode_state"], request_from_json(r)) for r in saved]
  assert any(st["phase"] == "env" for st, _ in states)  # a tool call to run again
  assert any(len(q.tokens) > st["turn_start"] for st, q in states)  # a turn's partial tokens
  resumed = fresh()
  got.update(run_all(resumed, [request_from_json(r) for r in saved]))
  assert sorted(got) == sorted(undisturbed)
  for e, c in undisturbed.items():
    for field in ("tokens", "logprobs", "versions"):
      np.testing.assert_array_equal(getattr(got[e].request, field), getattr(c.request, field))
    assert got[e].request.meta["episode"]["reward"] == c.request.meta["episode"]["reward"]


def test_turn_barrier_gives_the_same_episodes():
  base = run_all(make_driver(ScriptedSession(demo_script(), (EOS,))),
                 episode_requests(TASK, TOK, 5, 160))
  driver = make_driver(ScriptedSession(demo_script(), (EOS,)), turn_barrier=True)
  barrier = run_all(driver, episode_requests(TASK, TOK, 5, 160))
  for e, c in base.items():
    np.testing.assert_array_equal(barrier[e].request.tokens, c.request.tokens)


@pytest.mark.parametrize("limit", ["max_turns", "budget"])
def test_limits_end_episodes(limit):
  kw = {"max_turns": 1} if limit == "max_turns" else {}
  budget = 160 if limit == "max_turns" else 20
  driver = make_driver(ScriptedSession(demo_script(), (EOS,)), prefetch=False, **kw)
  out = run_all(driver, episode_requests(TASK, TOK, 3, budget))
  for c in out.values():
    ep = c.request.meta["episode"]
    assert len(c.request.tokens) <= budget and ep["reward"] == 0.0
    if limit == "max_turns":
      assert ep["max_turns"] and ep["turns"] == 1 and ep["weight"] == 1.0
    else:
      assert ep["truncated"] and ep["weight"] == 0.0
  key = "agent_episodes_max_turns" if limit == "max_turns" else "agent_episodes_truncated"
  assert driver.metrics()[key] == 3

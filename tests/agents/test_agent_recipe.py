"""Agentic training through the recipe (`--task=calculator`): held-out episode success rises
after the supervised warm-up; a SIGTERM while episodes are in flight, then `--resume`, gives
the episodes of an undisturbed run token for token, each in-flight one continued exactly from
its checkpointed tokens, log-probs and versions; with every step training exactly its own
groups, a SIGTERM mid-episode, then `--resume`, ends on the undisturbed run's weights, bit for
bit."""
import json
import os
import signal
import threading

import jax
import numpy as np
import pytest

from jaxrl_sys.rollout.wire import request_from_json
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.recipe import run as run_lib
from tests.train.common import quick

# 1-digit additions through the calculator tool (tiny preset). The learning run: a warm-up
# that leaves held-out success near 0.45, then GRPO on 64 groups of 4 episodes per step (one
# micro-batch of the groups in id order: the run is deterministic on a CPU). Measured on the
# 2-core CPU: held-out success 0.465, 0.527, 0.629, 0.684 at steps 4, 8, 12, 16; training
# reward 0.46 -> 0.59 (first and last 4 steps).
TASK = dict(task="calculator", task_args="num_ops=1,digits=1,ops=+", group_size=4,
            max_new_tokens=24, max_prompt_len=8, sft_learning_rate=3e-3, save_every=0)


def test_held_out_episode_success_rises(tmp_path):
  rc = quick(**TASK, prompts_per_step=64, micro_batch_groups=64, sft_steps=80, steps=16,
             eval_every=4, eval_prompts=64, learning_rate=1e-3, lr_warmup_steps=5,
             out_dir=str(tmp_path / "run"))
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc))
  evals = [row["eval_reward"] for row in result.run.history if "eval_reward" in row]
  rewards = [row["reward_mean"] for row in result.run.history]
  # 256 held-out episodes per evaluation (std <= 0.03), 1024 training episodes per window
  assert evals[-1] > evals[0] + 0.1, evals
  assert np.mean(rewards[-4:]) > np.mean(rewards[:4]) + 0.05, rewards
  row = result.run.history[-1]
  assert row["episode_turns"] > 1.5 and row["agent_tool_calls"] > 0
  assert os.path.exists(tmp_path / "run" / "agent.png")


def after_tool_results(driver, hook):
  """Wraps the episode driver's env factory: `hook()` runs on the env thread after every env
  step that returns a tool result (the episode has turns to go)."""
  make = driver.env_factory

  def watched_env():
    env = make()
    step = env.step

    def watched(action):
      out = step(action)
      if not out.done:
        hook()
      return out
    env.step = watched
    return env
  driver.env_factory = watched_env


class Recorder:
  """The loop's episode driver, recording every finished episode. With `stop`, the first env
  step that returns a tool result (the episode has turns to go) sends this process SIGTERM and
  holds that episode there until the run closes its rollout: the checkpoint the loop saves
  when it stops finds it in flight, between turns (its env step to be run again)."""

  def __init__(self, inner, seen, stop=False):
    self.inner, self.seen, self.armed = inner, seen, stop
    self.gate, self.once = threading.Event(), threading.Lock()
    if stop:
      after_tool_results(inner, self._stop)

  def _stop(self):
    if self.armed and self.once.acquire(blocking=False):  # env threads race here
      self.armed = False
      os.kill(os.getpid(), signal.SIGTERM)  # what a preemption sends; the loop's handler
      self.gate.wait(120)  # bounded: a loop that never aborts fails the test, not hangs

  def poll(self, *args, **kwargs):
    out = self.inner.poll(*args, **kwargs)
    for c in out:
      self.seen[c.request_id] = c.request
    return out

  def close(self):
    self.gate.set()  # the held env step returns (the driver waits for its env threads)
    self.inner.close()

  def __getattr__(self, name):
    return getattr(self.inner, name)


def _run(monkeypatch, out_dir, seen, stop=False, resume=False):
  build = run_lib.rollout_session
  monkeypatch.setattr(run_lib, "rollout_session",
                      lambda recipe, **kw: Recorder(build(recipe, **kw), seen, stop))
  # Async mode, 8 groups per step: the next step's groups are in flight at every step
  # boundary and the checkpoint saves them as they stand (`snapshot`); a negligible learning
  # rate, so the weights (and with them every episode's tokens) do not depend on which groups
  # a step happened to train.
  rc = quick(**TASK, prompts_per_step=8, micro_batch_groups=8, mode="async", max_staleness=1,
             sft_steps=20, steps=3, learning_rate=1e-9, out_dir=out_dir)
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc), resume=resume)
  monkeypatch.setattr(run_lib, "rollout_session", build)
  return result


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sigterm_mid_episode_then_resume_matches_undisturbed(tmp_path, monkeypatch):
  undisturbed: dict = {}
  _run(monkeypatch, str(tmp_path / "a"), undisturbed)
  seen: dict = {}
  out = str(tmp_path / "b")
  stopped = _run(monkeypatch, out, seen, stop=True)
  assert stopped.run.preempted and stopped.run.stop_signal == "SIGTERM"
  step = len(stopped.run.history)
  # the checkpoint holds the episodes in flight, mid-turn or between turns
  meta = json.load(open(os.path.join(out, "checkpoints", str(step), "meta", "metadata")))
  host = meta["host"]
  partial = [r for r in host["buffer"]["partials"] if "episode_state" in r["meta"]]
  assert partial and any(r["tokens"]["shape"][0] for r in partial)
  resumed = _run(monkeypatch, out, seen, resume=True)
  assert resumed.run.resumed_from == step and not resumed.run.preempted
  common = sorted(set(seen) & set(undisturbed))
  assert {r["request_id"] for r in partial} <= set(seen)  # every one finished after --resume
  assert len(common) >= len(partial)
  for e in common:  # the same episodes (how far each got before a boundary is timing)
    a, b = undisturbed[e], seen[e]
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.versions >= 0, b.versions >= 0)
    assert a.meta["episode"] == b.meta["episode"]
  for saved in map(request_from_json, partial):  # resumed exactly where the checkpoint stood
    final, n = seen[saved.request_id], saved.num_generated
    np.testing.assert_array_equal(final.tokens[:n], saved.tokens)
    np.testing.assert_array_equal(final.versions[:n], saved.versions)
    np.testing.assert_array_equal(final.logprobs[:n], saved.logprobs)
    later = final.versions[n:]
    assert (later[later >= 0] >= step).all()  # sampled after the resume by version >= step


class StopMidEpisode:
  """The loop's episode driver, unchanged, except that this process gets SIGTERM the first time
  an env step of an episode sampled by weights `version` returns a tool result (the episode has
  more turns to go; the other episodes are mid-turn on the engines)."""

  def __init__(self, driver, version):
    self.driver, self.version, self.published = driver, version, None
    after_tool_results(driver, self._stop)

  def _stop(self):
    if self.published == self.version:
      self.version = None  # once
      os.kill(os.getpid(), signal.SIGTERM)

  def publish(self, params, version, moe_state=None):
    self.published = version
    self.driver.publish(params, version, moe_state)

  def __getattr__(self, name):
    return getattr(self.driver, name)


def _run_exact(monkeypatch, out_dir, stop_in=None, resume=False):
  build = run_lib.rollout_session
  if stop_in is not None:
    monkeypatch.setattr(run_lib, "rollout_session",
                        lambda recipe, **kw: StopMidEpisode(build(recipe, **kw), stop_in))
  # Sync mode, no over-provisioning: every step trains exactly its own 8 groups (one
  # micro-batch, in group id order), with a real learning rate. The shapes of `_run`'s runs
  # (8 groups of 4 per micro-batch, 32 engine slots per engine): the same compiled programs.
  rc = quick(**TASK, prompts_per_step=8, micro_batch_groups=8, sft_steps=20, steps=3,
             learning_rate=1e-3, out_dir=out_dir)
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc), resume=resume)
  monkeypatch.setattr(run_lib, "rollout_session", build)
  return result


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sigterm_mid_episode_then_resume_trains_the_undisturbed_weights(tmp_path, monkeypatch):
  undisturbed = _run_exact(monkeypatch, str(tmp_path / "a"))
  out = str(tmp_path / "b")
  stopped = _run_exact(monkeypatch, out, stop_in=1)  # during step 2 (weights version 1)
  assert stopped.run.preempted and stopped.run.stop_signal == "SIGTERM"
  assert len(stopped.run.history) == 2  # the step finished, was checkpointed, the run exited
  resumed = _run_exact(monkeypatch, out, resume=True)
  assert resumed.run.resumed_from == 2 and not resumed.run.preempted
  rows = stopped.run.history + resumed.run.history
  assert len(rows) == len(undisturbed.run.history) == 3
  for a, b in zip(undisturbed.run.history, rows):
    assert a["group_ids"] == b["group_ids"]
    assert (a["reward_mean"], a["loss"]) == (b["reward_mean"], b["loss"])
  want = jax.tree_util.tree_leaves_with_path(jax.device_get(undisturbed.run.state.params))
  got = jax.tree.leaves(jax.device_get(resumed.run.state.params))
  assert len(want) == len(got)
  for (path, a), b in zip(want, got):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def test_user_env_from_the_env_flag():
  from absl import flags  # pylint: disable=import-outside-toplevel

  from jaxrl_sys.agents import EpisodeDriver  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.recipe import cli  # pylint: disable=import-outside-toplevel
  from tests.agents.scripted import ScriptedSession, run_all  # pylint: disable=import-outside-toplevel
  fv = flags.FlagValues()
  cli.define_flags(fv)
  fv(["grpo", "--task=jsonl:examples/sums.jsonl", "--env=examples.adder_env:AdderEnv",
      "--max_turns=2", "--steps=20"])
  recipe = recipe_lib.build_recipe(cli.run_config_from_flags(fv))
  assert recipe.agentic and recipe.agent.max_turns == 2
  assert recipe.plan.engine.extend_prefixes
  tok = recipe.model.tokenizer
  problems = [recipe.task.problem(i) for i in range(4)]

  def script(e, t):  # call the tool, then copy its result
    p = problems[e]
    a, b = p.prompt.rstrip("=").split("+")
    text = f"<<add {a}+{b}>>" if t == 0 else str(int(a) + int(b))
    return tok.encode(text, eos=True)

  driver = EpisodeDriver(ScriptedSession(script, (tok.eos_id,)), recipe.env_factory, recipe.task,
                         recipe.turn_format, recipe.agent)
  reqs = [r for r in _group_requests(recipe, 4)]
  out = run_all(driver, reqs)
  for e, c in out.items():
    assert c.request.meta["episode"]["reward"] == 1.0 and c.request.meta["episode"]["turns"] == 2
  assert driver.metrics()["agent_tool_ok"] == 4


def _group_requests(recipe, n):
  from jaxrl_sys.train.loop.groups import group_requests  # pylint: disable=import-outside-toplevel
  reqs = group_requests(recipe.task, recipe.model.tokenizer, range(n), 1, seed=0,
                        max_new_tokens=recipe.config.loop.max_new_tokens,
                        max_prompt_len=recipe.config.loop.max_prompt_len)
  for r in reqs:
    r.meta["episode"] = r.request_id
  return reqs

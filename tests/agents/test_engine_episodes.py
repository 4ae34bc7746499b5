"""Episodes on real engines: the training sequence is exactly the sampled plus the observation
tokens, the trainer's log-probs match the engine's on the sampled ones, the gradient is zero at
observation positions; a one-turn episode is the single-turn request; sticky sessions reuse the
previous turn's KV and change no token."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys.agents import AgentConfig, EpisodeDriver, turn_request_id
from jaxrl_sys.losses.policy import policy_loss
from jaxrl_sys.models import forward, unembedding
from jaxrl_sys.rollout import InProcessWorker, ManagerConfig, RolloutManager
from jaxrl_sys.rollout.elastic.offload import OffloadConfig, OffloadDriver
from jaxrl_sys.tasks import TaskEnv
from jaxrl_sys.tasks.turns import PlainFormat
from jaxrl_sys.train.loop.groups import group_requests
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import train_config_for_algo
from jaxrl_sys.train.step.update import token_logprobs
from tests.agents import common
from tests.agents.scripted import run_all


class Recorder:
  """Wraps a session and records every turn request submitted and every completion polled."""

  def __init__(self, session):
    self.session, self.submitted, self.completed = session, {}, {}

  def submit(self, requests):
    for r in requests:
      self.submitted[r.request_id] = dataclasses.replace(r)
    self.session.submit(requests)

  def poll(self, min_count=0, timeout=None):
    out = self.session.poll(min_count, timeout)
    for c in out:
      self.completed[c.request_id] = c
    return out

  def __getattr__(self, name):
    return getattr(self.session, name)


def _requests(n_groups=4, samples=2):
  return group_requests(common.TASK, common.TOK, range(n_groups), samples, seed=3,
                        max_new_tokens=common.BUDGET, max_prompt_len=20)


@pytest.fixture(scope="module")
def episodes():
  session = Recorder(common.session())
  driver = EpisodeDriver(session, common.EchoEnv, common.TASK, PlainFormat(common.TOK),
                         AgentConfig(max_turns=3, max_turn_tokens=common.TURN_TOKENS))
  out = run_all(driver, _requests())
  driver.close()
  return out, session


def test_sequence_is_sampled_then_observation_tokens(episodes):
  out, rec = episodes
  tok, eos = common.TOK, common.TOK.eos_id
  for e, c in out.items():
    r = c.request
    want, mask = [], []
    for t in range(r.meta["episode"]["turns"]):
      turn = rec.completed[turn_request_id(e, t)].request
      # each turn's prompt is the episode so far, token for token
      np.testing.assert_array_equal(rec.submitted[turn.request_id].prompt,
                                    np.concatenate([r.prompt, np.asarray(want, np.int32)]))
      sampled = list(turn.tokens)
      glue = [] if sampled[-1] == eos else [eos]  # a turn cut by its budget is closed
      obs = [] if t == 2 else tok.encode(f"\nturn {t + 1}\n")
      want += sampled + glue + obs
      mask += [1] * len(sampled) + [0] * (len(glue) + len(obs))
      np.testing.assert_array_equal(r.logprobs[len(mask) - len(obs) - len(glue) - len(sampled):
                                               len(mask) - len(obs) - len(glue)], turn.logprobs)
    np.testing.assert_array_equal(r.tokens, want)
    np.testing.assert_array_equal((r.versions >= 0).astype(int), mask)
    np.testing.assert_array_equal(r.logprobs[np.asarray(mask) == 0], 0.0)
  assert sum(c.request.meta["episode"]["turns"] for c in out.values()) == 3 * len(out)


def _batch(out):
  samples = [batch_lib.Sample(c.request.prompt, c.request.tokens, c.request.logprobs,
                              c.request.versions, 1.0 - 0.5 * i, 1.0,
                              mask=(c.request.versions >= 0).astype(np.float32))
             for i, c in enumerate(out.values())]
  return batch_lib.pack(samples, len(samples), 64, common.TOK.pad_id, window=common.BUDGET)


def test_trainer_logprobs_match_and_observations_get_no_gradient(episodes):
  out, _ = episodes
  b = _batch(out)
  tc = train_config_for_algo("grpo", decoupled=True, kl_coef=0.05)
  lp, _, _ = jax.jit(token_logprobs, static_argnums=(1, 2))(common.params(), common.CFG, tc, b)
  m = b.loss_mask > 0
  assert m.sum() > 0 and (b.versions[~m] == -1).all() and (b.versions[m] >= 0).all()
  np.testing.assert_allclose(np.asarray(lp)[m], b.behav_logprobs[m], atol=1e-5, rtol=0)

  # The loss as a function of the logits at the scored positions (plain jnp log-softmax):
  # its gradient at an observation or glue position must be exactly zero.
  h = forward(common.params(), common.CFG, b.tokens, attention_mask=b.attention_mask).hidden
  pos = b.score_start[:, None] + np.arange(b.targets.shape[1])[None, :]
  hw = jnp.take_along_axis(h, jnp.asarray(pos)[..., None], axis=1)
  logits = hw @ unembedding(common.params(), common.CFG)

  def loss(logits):
    lpf = jnp.take_along_axis(jax.nn.log_softmax(logits), b.targets[..., None], -1)[..., 0]
    return policy_loss(lpf, jax.lax.stop_gradient(lpf), jnp.asarray(b.advantages),
                       jnp.asarray(b.loss_mask), config=tc.loss,
                       ref_logprobs=jax.lax.stop_gradient(lpf) - 0.1,
                       behav_logprobs=jnp.asarray(b.behav_logprobs)).loss

  g = np.asarray(jax.jit(jax.grad(loss))(logits))
  assert np.abs(g[m]).sum() > 0
  assert (g[~m] == 0).all()


def test_one_turn_episode_is_the_single_turn_request():
  reqs = _requests(3, 2)
  plain = common.session()
  plain.submit(reqs)
  ref = {c.request_id: c.request for c in plain.poll(min_count=len(reqs))}
  driver = EpisodeDriver(common.session(), lambda: TaskEnv(common.TASK), common.TASK,
                         PlainFormat(common.TOK), AgentConfig(max_turns=1))
  out = run_all(driver, reqs)
  for rid, r in ref.items():
    np.testing.assert_array_equal(out[rid].request.tokens, r.tokens)
    np.testing.assert_array_equal(out[rid].request.logprobs, r.logprobs)
    problem = common.TASK.problem(r.meta["problem"])
    assert out[rid].request.meta["episode"]["reward"] == common.TASK.reward(
        problem, common.TOK.decode(r.tokens))


def test_sticky_sessions_reuse_the_kv_and_change_no_token():
  runs = {}
  for sticky in (True, False):
    workers = [InProcessWorker(f"w{i}", common.CFG, common.engine_config())
               for i in range(2)]
    m = RolloutManager(workers, config=ManagerConfig(sticky_sessions=sticky, balance=False))
    m.publish(common.params(), 0)
    driver = EpisodeDriver(m, common.EchoEnv, common.TASK, PlainFormat(common.TOK),
                           AgentConfig(max_turns=3, max_turn_tokens=common.TURN_TOKENS))
    out = run_all(driver, _requests(4, 2))
    stats = [w.engine.stats for w in workers]
    reused = sum(s.reused_tokens for s in stats)
    prefilled = sum(s.prefill_tokens + s.extend_tokens for s in stats)
    runs[sticky] = (out, reused / (reused + prefilled))
    driver.close()
  (on, ratio_on), (off, ratio_off) = runs[True], runs[False]
  for e, c in on.items():
    np.testing.assert_array_equal(c.request.tokens, off[e].request.tokens)
    np.testing.assert_allclose(c.request.logprobs, off[e].request.logprobs, atol=1e-5)
  assert ratio_on > 0.5 and ratio_on > ratio_off


def test_aborted_episodes_resume_exactly(episodes):
  """The loop's step boundary in sync mode: in-flight episodes aborted (mid-turn or in a
  tool call), resubmitted later: every token, log-prob and version as if never stopped."""
  undisturbed, _ = episodes
  driver = EpisodeDriver(common.session(), common.EchoEnv, common.TASK, PlainFormat(common.TOK),
                         AgentConfig(max_turns=3, max_turn_tokens=common.TURN_TOKENS))
  driver.submit(_requests())
  got = {}
  for _ in range(3):
    for c in driver.poll(min_count=1, timeout=0.01):
      got[c.request_id] = c
  partial = driver.abort()
  assert partial and any(len(r.tokens) for r in partial) and not driver.num_pending()
  assert any(r.meta["episode_state"]["turn"] > 0 for r in partial)
  got.update(run_all(driver, partial))
  assert sorted(got) == sorted(undisturbed)
  for e, c in undisturbed.items():
    for f in ("tokens", "logprobs", "versions"):
      np.testing.assert_allclose(getattr(got[e].request, f), getattr(c.request, f), atol=1e-5)
  driver.close()


def test_episodes_under_the_adaptive_offload_end_as_undisturbed(episodes):
  """The trainer's engine starts the episodes, hands off at the window's end (turns in flight
  seeded to the remote worker, every token kept), the remote one finishes them: every episode
  as the undisturbed run, whose turns all ran on one engine."""
  undisturbed, _ = episodes
  local = InProcessWorker("trainer", common.CFG, common.engine_config(), local=True)
  remote = InProcessWorker("spot", common.CFG, common.engine_config(), local=False)
  m = RolloutManager([local, remote])
  m.publish(common.params(), 0)
  offload = OffloadDriver(OffloadConfig(t_init=1e9))
  m.add_tick_hook(offload)
  driver = EpisodeDriver(m, common.EchoEnv, common.TASK, PlainFormat(common.TOK),
                         AgentConfig(max_turns=3, max_turn_tokens=common.TURN_TOKENS))
  driver.submit(_requests())
  offload.begin_step(m)
  m.set_accepting("spot", False)  # the spot worker is still starting: the trainer seeds alone
  assert offload.deadline() is not None
  out = {}
  while m.fleet.stats.tokens == 0:  # until the trainer's engine generated a chunk
    out.update((c.request_id, c) for c in driver.poll(min_count=0, timeout=0.01))
  m.set_accepting("spot", True)
  assert offload.hand_off(m) > 0
  out.update(run_all(driver, []))
  driver.close()
  common.assert_same_episodes(out, undisturbed)
  # Turns ran on both sides: seeded ones continued on the spot worker where the trainer stopped.
  workers = {w for e in out for t in range(3)
             for w, _, _ in m.fleet.provenance(turn_request_id(e, t))}
  assert workers == {"trainer", "spot"}
  metrics = offload.end_step(m, t_wait_train=0.0, t_train=1.0)
  assert metrics["tokens_local"] > 0 and metrics["tokens_remote"] > 0

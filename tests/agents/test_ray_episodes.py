"""Episodes on real Ray workers that are SIGKILLed mid-turn and between turns: every episode
finishes, token for token as an undisturbed run in this process."""
import os
import signal
import time


from jaxrl_sys.agents import AgentConfig, EpisodeDriver
from jaxrl_sys.agents.episode import turn_request_id
from jaxrl_sys.rollout import ManagerConfig, RolloutManager
from jaxrl_sys.tasks.turns import PlainFormat
from jaxrl_sys.train.loop.groups import group_requests
from tests.agents import common
from tests.agents.scripted import run_all
from tests.conftest import RAY_COMPILE_CACHE


class SlowEchoEnv(common.EchoEnv):
  """EchoEnv whose steps take 0.4 s (a tool): episodes spend time between turns."""

  def step(self, action):
    time.sleep(0.4)
    return super().step(action)


def _requests():
  return group_requests(common.TASK, common.TOK, range(3), 2, seed=9,
                        max_new_tokens=common.BUDGET, max_prompt_len=20)


def _driver(session, env=common.EchoEnv):
  return EpisodeDriver(session, env, common.TASK, PlainFormat(common.TOK),
                       AgentConfig(max_turns=3, max_turn_tokens=common.TURN_TOKENS,
                                   check_template=False))


def test_workers_killed_mid_turn_and_between_turns(ray_session):  # pylint: disable=unused-argument
  from jaxrl_sys.rollout.weights.ray import RayWeightStore  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.rollout.workers.ray import RayWorker  # pylint: disable=import-outside-toplevel
  undisturbed = run_all(_driver(common.session()), _requests())
  workers = [RayWorker(f"a{i}", common.CFG, common.engine_config(),
                       compile_cache=RAY_COMPILE_CACHE, token_delay=0.02) for i in range(3)]
  m = RolloutManager(workers, store=RayWeightStore(),
                     config=ManagerConfig(theta=1, heartbeat_timeout=20.0, balance=False))
  m.publish(common.params(), 0)
  driver = _driver(m, SlowEchoEnv)
  driver.submit(_requests())
  out, killed, deadline = {}, {}, time.monotonic() + 300
  while driver.num_pending() and time.monotonic() < deadline:
    for c in driver.poll(min_count=1, timeout=0.05):
      out[c.request_id] = c
    fleet = m.fleet
    live = [w for w in workers if w.worker_id in fleet and w.worker_id not in killed.values()]
    if "mid_turn" not in killed:  # a worker holding a turn with tokens already generated
      for w in live:
        if any(fleet.provenance(r) for r in fleet[w.worker_id].assigned):
          os.kill(w.pid(), signal.SIGKILL)
          killed["mid_turn"] = w.worker_id
          break
    elif "between_turns" not in killed and len(live) > 1:
      # the worker an episode in a tool call will come back to (its sticky session): the one
      # that produced the last token of its previous turn
      for ep in driver.episodes.values():
        prov = fleet.provenance(turn_request_id(ep.episode_id, ep.turn - 1)) if ep.turn else []
        w = prov[-1][0] if prov else None
        if ep.phase == "env" and ep.turn > 0 and w in [x.worker_id for x in live]:
          victim = next(x for x in live if x.worker_id == w)
          os.kill(victim.pid(), signal.SIGKILL)
          killed["between_turns"] = w
          break
  assert set(killed) == {"mid_turn", "between_turns"}, killed
  common.assert_same_episodes(out, undisturbed)
  assert m.fleet.stats.lost == 2 and m.fleet.stats.migrated >= 1
  driver.close()
  m.close()

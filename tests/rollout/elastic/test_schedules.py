"""Preemption schedules: a trace replayed against a clock returns each event once, in order;
random kills are seeded and independent of how often they are asked."""
import math

import numpy as np
import pytest

from jaxrl_sys.rollout.elastic.schedules import ChaosSchedule, TracePlayer
from jaxrl_sys.rollout.elastic.trace_formats import parse_bamboo


def _drain(schedule, nows):
  out = []
  for now in nows:
    out += schedule.due(now)
  return out


def test_player_returns_each_event_once_in_order():
  trace = parse_bamboo("".join(f"{60000 * (i // 2)},add,n{i}\n" for i in range(40))
                       + "".join(f"{1_500_000 + 30000 * i},remove,n{i}\n" for i in range(40)))
  rng = np.random.default_rng(0)
  for scale in (1.0, 0.01):
    for _ in range(5):
      nows = np.sort(rng.uniform(0, trace.end * scale * 1.1, rng.integers(1, 30)))
      # repeated times return nothing new; the last call is past the end
      nows = np.append(np.repeat(nows, 2), max(nows[-1], trace.end * scale))
      player = TracePlayer(trace, time_scale=scale)
      got = _drain(player, nows)
      assert tuple(got) == trace.events and player.done and player.next_time() is None
  player = TracePlayer(trace, time_scale=2.0, origin=100.0)
  assert player.due(99.0) == [] and player.next_time() == 100.0
  assert len(player.due(100.0)) == 2  # both adds at trace time 0
  with pytest.raises(ValueError, match="clock went back"):
    player.due(50.0)


@pytest.mark.parametrize("distribution", ["exponential", "uniform"])
def test_chaos_schedule_is_seeded_and_call_pattern_free(distribution):
  def make(seed=7):
    return ChaosSchedule(50.0, seed=seed, restart_after=20.0, slots=4, distribution=distribution)

  reference = make().to_trace(5000.0)  # a valid trace: removes only of live slots
  rng = np.random.default_rng(1)
  got = _drain(make(), np.append(np.sort(rng.uniform(0, 5000, 200)), 5000.0))
  assert tuple(got) == reference.events
  assert reference.counts().removes > 50 and reference.max_live() == 4
  assert make(8).to_trace(5000.0).events != reference.events
  kills = [e.t for e in reference.events if e.kind == "remove"]
  gaps = np.diff([0.0] + kills)
  assert np.mean(gaps) == pytest.approx(50.0, rel=0.35)
  if distribution == "uniform":
    assert gaps.min() >= 25.0 - 1e-9 and gaps.max() <= 75.0 + 1e-9
  adds = {}
  for e in reference.events:  # every kill is followed by the restart 20 s later
    if e.kind == "add" and e.t > 0:
      adds[e.node] = adds.get(e.node, []) + [e.t]
  for e in reference.events:
    if e.kind == "remove" and e.t + 20.0 <= 5000.0:
      assert any(math.isclose(t, e.t + 20.0) for t in adds[e.node])


def test_chaos_schedule_without_restarts_runs_dry():
  s = ChaosSchedule(10.0, seed=0, restart_after=math.inf, slots=3, initial_adds=False)
  events = s.due(1e6)
  assert [e.kind for e in events] == ["remove"] * 3
  assert sorted(e.node for e in events) == ["slot-0", "slot-1", "slot-2"]
  with pytest.raises(ValueError):
    ChaosSchedule(0.0)
  with pytest.raises(ValueError):
    ChaosSchedule(1.0, distribution="gamma")

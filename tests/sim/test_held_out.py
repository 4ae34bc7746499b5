"""The held-out figures: the break-even arithmetic and the ablation scenarios against hand
computations; opt-in (JAXRL_SIM_PAPER=1, ~15 min on 2 loaded cores) every held-out figure
against its two-sided band around the paper's (sim/README.md reports each, met or not)."""
import math
import os

import pytest

from jaxrl_sys.rollout.elastic.trace_formats import bundled_trace, load_trace
from jaxrl_sys.sim import held_out, paper
from jaxrl_sys.sim.fit import FITTED
from jaxrl_sys.sim.prices import RLBOOST_PRICES
from jaxrl_sys.sim.startup import WARM_RESTART


def _row(setting, tokens, spot_hours, segment=None, wall=3600.0):
  return {"preset": "qwen3-14b", "setting": setting, "segment": segment,
          "result": {"wall_s": wall, "tokens": tokens, "spot_instance_hours": spot_hours}}


def test_break_even_discount_by_hand():
  # Co-located: one 8xH100 for an hour, 1M tokens. RLBoost: the same hour, 2M tokens, 10 spot
  # instance-hours of 2 GPUs. Tokens per dollar are equal when RLBoost costs twice the node
  # hour: 83.79 + 10 x 2 x 10.47375 x (1 - d) = 2 x 83.79, i.e. d = 1 - 83.79 / 209.475 = 0.6.
  rows = [_row("colocated", 1e6, 0.0), _row("rlboost", 2e6, 10.0, "a")]
  assert held_out.break_even(rows, "qwen3-14b") == pytest.approx(0.6, abs=1e-9)
  assert held_out.cost_efficiency_at(rows, "qwen3-14b", 0.6) == pytest.approx(1.0)
  node_h = 8 * RLBOOST_PRICES.on_demand_gpu_hour
  assert held_out.cost_efficiency_at(rows, "qwen3-14b", 0.0) == pytest.approx(
      2 * node_h / (node_h + 20 * RLBOOST_PRICES.on_demand_gpu_hour))
  # the mean over segments: a second segment without spot instances, 10% fewer tokens
  rows.append(_row("rlboost", 0.9e6, 0.0, "b"))
  mean = lambda d: (2 * node_h / (node_h + 20 * (1 - d) * node_h / 8) + 0.9) / 2  # noqa: E731
  d = held_out.break_even(rows, "qwen3-14b")
  assert mean(d) == pytest.approx(1.0, abs=1e-9) and 0.6 < d < 1
  # cheaper at no discount: 0; never cheaper: 1
  assert held_out.break_even([_row("colocated", 1e6, 0.0), _row("rlboost", 3e6, 1.0, "a")],
                             "qwen3-14b") == 0.0
  assert held_out.break_even([_row("colocated", 1e6, 0.0), _row("rlboost", 0.5e6, 1.0, "a")],
                             "qwen3-14b") == 1.0


def test_the_preempt_and_replace_scenario_is_the_papers():
  # "5 of 6 instances are preempted and replacements arrive gradually"
  t = held_out.preempt_and_replace_trace()
  assert [t.live_at(x) for x in (0, 1199, 1200, 1800, 2400, 3000, 3600, 4200)] == \
      [6, 6, 1, 2, 3, 4, 5, 6]
  cfg = held_out.scenario_base(FITTED)
  assert cfg.preset.name == "qwen3-14b" and cfg.startup == WARM_RESTART and cfg.offload.cap_workers


P3 = bundled_trace("bamboo/p3-trace.csv")
_OPT_IN = pytest.mark.skipif(os.environ.get("JAXRL_SIM_PAPER") != "1",
                             reason="the held-out runs take ~15 min: JAXRL_SIM_PAPER=1")


@pytest.fixture(scope="module")
def figures():
  return paper.held_out_figures(load_trace(P3), FITTED, jobs=2)


# Held-out figures outside their band (run once, `spot_sim --paper`; sim/README.md has the
# table), each with the measurement that explains it: strict xfails, so that a change which
# brings one inside fails here and the note is updated.
_FLEET_8B = ("the 8B fleet runs 8.0-15.6 instances a segment where the paper's figures imply "
             "3.8: N_prem does not bind on 8B (segment 0-2h: N_prem 17.7 for 10.2 used, T_seed "
             "205 s; capped at 4 the same segment gives 1.75x / 1.40)")
KNOWN_MISSES = {
    "bamboo 8B ce": "1.03 vs 1.34: " + _FLEET_8B,
    "bamboo 32B x": "1.83x vs 1.51x: the 32B fleet runs 8.1-10.4 instances a segment where the "
                    "paper's figures imply 5.7",
    "bamboo 32B ce": "1.41 vs 1.28 (same)",
    "no seeding x": "0.67 vs 0.81: without the window the trainer's GPUs generate nothing while "
                    "one instance is left",
    "memory x": "1.00 vs 1.06: no instance count repeats in the scenario before its last "
                "replacement, and the table starts empty (the release ships one pre-filled)",
    "migration cut at 200 s": "0.57 vs 0.76: with no replacement the three lost instances' "
                              "capacity, not their lost tokens, makes most of the overhead "
                              "(recompute 184 s, migration 79 s)",
    "break-even discount 8B": "0.73 vs ~0.30: " + _FLEET_8B,
    "ce at no discount 8B": "0.46, below veRL.2x's 0.76: " + _FLEET_8B,
}


def _cases(keys):
  return [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[k]))
          if k in KNOWN_MISSES else k for k in keys]


@_OPT_IN
@pytest.mark.parametrize("key", _cases([k for k, v in paper.HELD_OUT.items()
                                        if not math.isnan(v)]))
def test_held_out_figure_within_its_band(figures, key):
  ours, detail = figures
  bands = {**paper.BANDS, **detail["bands"]}
  lo, hi = bands[key]
  print(f"{key}: ours {ours[key]:.3f}, paper {paper.HELD_OUT[key]}, band {lo:.3f}..{hi:.3f}")
  assert lo <= ours[key] <= hi, (key, ours[key], (lo, hi))


@_OPT_IN
@pytest.mark.parametrize("key", _cases([k for k, v in paper.HELD_OUT.items() if math.isnan(v)]))
def test_held_out_direction_only(figures, key):
  # Figures the paper gives only as a direction or relative to another run.
  ours, detail = figures
  lo, hi = {**paper.BANDS, **detail["bands"]}[key]
  assert lo <= ours[key] <= hi, (key, ours[key], (lo, hi))

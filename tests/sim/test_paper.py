"""RLBoost's own figures: what the fit changes; the calibration the suite runs (the fast plan:
the 14B static-pool ratios within 10%, N_prem with the cap on, the saturation, the windows and
the co-located rollout share within their bands); opt-in (JAXRL_SIM_PAPER=1, ~2-5 min each on
2 loaded cores) the full plan and the release's 8B figures. The held-out figures are in
test_held_out.py; sim/README.md has every figure."""
import dataclasses
import os

import pytest

from jaxrl_sys.sim import paper, points
from jaxrl_sys.sim.fit import FITTED, InstanceFit



def test_the_fit_changes_only_what_it_says():
  from jaxrl_sys.sim.presets import QWEN3_14B  # pylint: disable=import-outside-toplevel
  fit = InstanceFit(decode_scale=2.0, prefill_scale=3.0, mem_fraction=0.6, max_running=256)
  p = fit.apply(QWEN3_14B)
  assert p.decode.fixed_s == pytest.approx(2 * QWEN3_14B.decode.fixed_s)
  assert p.decode.per_ctx_token_s == QWEN3_14B.decode.per_ctx_token_s
  assert p.prefill_s_per_token == pytest.approx(3 * QWEN3_14B.prefill_s_per_token)
  # (2 GPUs x 80 GB x 0.6 - 29.5 GB of weights) / 160 KiB per token
  assert p.decode.kv_capacity_tokens == int((2 * 80e9 * 0.6 - QWEN3_14B.weight_bytes) // 163840)
  assert p.train_s_per_token == QWEN3_14B.train_s_per_token and fit.engine().max_running == 256
  with pytest.raises(ValueError, match="do not fit"):
    InstanceFit(mem_fraction=0.1).apply(QWEN3_14B)
  # the host-side step time overlaps the GPU's: a step takes the longer of the two
  q = InstanceFit(decode_scale=2.0, step_extra_s=0.02).apply(QWEN3_14B).decode
  assert q.fixed_s == pytest.approx(2 * QWEN3_14B.decode.fixed_s) and q.host_s == 0.02
  assert q.per_seq_s == pytest.approx(2 * QWEN3_14B.decode.per_seq_s)
  assert q.step_time(1, 100) == 0.02  # one sequence: host-bound
  gpu = q.fixed_s + 300 * q.per_batch_s(8000)
  assert gpu > 0.02 and q.step_time(300, 8000) == pytest.approx(gpu)  # a full batch: the GPU
  with pytest.raises(ValueError, match="step_extra_s"):
    InstanceFit(step_extra_s=-1.0)
  # training time scales both of its terms, and nothing else
  t = InstanceFit(train_scale=1.2).apply(QWEN3_14B)
  assert t.train_s_per_token == pytest.approx(1.2 * QWEN3_14B.train_s_per_token)
  assert t.train_attn_s == pytest.approx(1.2 * QWEN3_14B.train_attn_s)
  assert t.decode == InstanceFit().apply(QWEN3_14B).decode
  with pytest.raises(ValueError, match="scales > 0"):
    InstanceFit(train_scale=0.0)
  # no resident trainer state: the local engines hold what an instance holds
  assert p.local_kv_tokens is None and p.local() is p


def test_local_engines_lose_the_trainers_resident_shards_and_micro_batches_are_two_groups():
  from jaxrl_sys.sim.driver import Workload  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.sim.presets import QWEN3_14B, QWEN3_32B  # pylint: disable=import-outside-toplevel
  # Independent arithmetic: one 8xH100 node keeps 14.768e9 fp32 actor parameters (4 bytes) and
  # bf16 reference parameters (2 bytes) sharded over its 8 GPUs; a TP-2 local engine spans 2 of
  # them: 22.2 GB less KV than a spot instance, at 163,840 bytes per token.
  p = FITTED.apply(QWEN3_14B)
  inst = int((2 * 80e9 * 0.6 - QWEN3_14B.weight_bytes) // 163840)
  assert p.decode.kv_capacity_tokens == inst
  lost = (4 + 2) * QWEN3_14B.params_b * 1e9 / 8 * 2 / 163840
  assert p.local_kv_tokens == pytest.approx(inst - lost, abs=1)
  assert p.local().decode.kv_capacity_tokens == p.local_kv_tokens
  assert p.local().decode.fixed_s == p.decode.fixed_s  # only the KV pool differs
  # 32B: SGLang at 0.6 of 80 GB keeps 48 GB per GPU, 32.8 GB of it its TP-2 weights; the
  # release's shards over 8 GPUs (its two-node script's fsdp_size=8) need 24.6 GB: no KV is
  # left, so the trainer offloads its parameters and the local engines hold an instance's KV.
  assert 0.6 * 80e9 - QWEN3_32B.weight_bytes / 2 < 6 * QWEN3_32B.params_b * 1e9 / 8
  q = FITTED.apply(QWEN3_32B)
  assert q.local_kv_tokens is None and q.local().decode.kv_capacity_tokens == int(
      (2 * 80e9 * 0.6 - QWEN3_32B.weight_bytes) // 262144)
  with pytest.raises(ValueError, match="leaves no KV"):
    dataclasses.replace(FITTED, offload_if_full=False).apply(QWEN3_32B)
  # sharded over 16 GPUs instead (not the release's fsdp_size), 32B would keep a sliver of KV
  r = dataclasses.replace(FITTED, trainer_shard_gpus=16).apply(QWEN3_32B)
  assert r.local_kv_tokens == pytest.approx(
      r.decode.kv_capacity_tokens - 6 * QWEN3_32B.params_b * 1e9 / 16 * 2 / 262144, abs=1)
  # the release's min_stream_batch_size=16 responses over n=8 responses per prompt
  assert Workload().micro_batch_groups == 16 // 8


def test_the_static_pool_and_the_length_sweep_are_modelled_as_the_paper_ran_them():
  # A fixed pool (every instance used: no N_prem cap) under the adaptive controller (nothing in
  # RLBOOST.md fixes T_seed for it), RLBoost's released settings: first window 150 s, floor 5 s,
  # rate 1/3. The length sweep runs the same with Algorithm 1's cap on.
  cfg = points.pool_config(FITTED)
  off = cfg.offload
  assert off.fixed is None and not off.cap_workers and off.memory
  assert (off.t_init, off.t_min, off.rate) == (150.0, 5.0, pytest.approx(1 / 3))
  assert cfg.mode == "rlboost" and cfg.workload.lengths.max_tokens == points.CAP_14K
  swept = points.pool_config(FITTED, points.CAP_5K, capped=True)
  assert swept.offload.cap_workers and swept.offload.cap_starts_at_resv
  assert swept.workload.lengths.max_tokens == 5120 and points.SWEEP_POOL > 6


def _check_bands(ours, keys):
  missed = {k: (round(ours[k], 3), paper.BANDS[k]) for k in keys
            if not paper.within(k, ours[k])}
  assert not missed, missed


# The suite's calibration: the fast plan (6 steps, the first 2 skipped) of every 14B point -
# seven Qwen3-14B simulations through the real manager and controller. Asserted: the static-pool
# ratios within 10% of the paper's, and what Algorithm 1 itself settles on within its band
# (`paper.BANDS`: N_prem with the cap on, the saturation 12 vs 6 instances, the windows at one
# and six instances, the co-located rollout share).
FAST_KEYS = ("static 1 inst x", "static 1 inst ce", "static 6 inst x", "static 6 inst ce",
             "cap 5K N_prem", "cap 14K N_prem", "static 12 / 6 inst x", "14B 1 inst T_seed",
             "14B 6 inst T_seed", "co-located rollout share")


def test_calibration_fast_variant_with_the_cap_on():
  ours = points.calibration_points(FITTED, points.FAST)
  for key in FAST_KEYS[:4]:
    assert ours[key] == pytest.approx(paper.CALIBRATION[key], rel=0.10), (key, ours)
  _check_bands(ours, FAST_KEYS)
  # the paper's shape: one instance pays for itself, six gain more, a longer cap asks for more
  assert 1.0 < ours["static 1 inst ce"] < ours["static 6 inst ce"]
  assert ours["cap 5K N_prem"] < ours["cap 14K N_prem"]
  assert ours["14B 6 inst T_seed"] < ours["14B 1 inst T_seed"]


_OPT_IN = pytest.mark.skipif(os.environ.get("JAXRL_SIM_PAPER") != "1",
                             reason="RLBoost's end-to-end points take minutes: JAXRL_SIM_PAPER=1")


# Figures outside their band at the full plan, each with the measurement that explains it
# (sim/README.md, "Calibrated on the controller's outputs"): a strict xfail, so that a change
# which brings one inside fails here and the note is updated.
KNOWN_MISSES = {
    "14B 2 inst T_seed": "335 s vs the release's 212 s: the windows fall more slowly with the "
                         "instance count than the release's table (they meet at 1, 3 and 6)",
    "14B 4 inst T_seed": "148 s vs 60 s (same)",
    "14B 5 inst T_seed": "104 s vs 8 s (same)",
    "8B colocated tok/s": "5,045 vs ~10,000 tokens/s: the 14B-fitted host time per step (37.5 "
                          "ms) paces 8B's decode as 14B's",
    "8B 1 inst x": "1.45x vs 1.2x: 8B's rollout share is 0.71 (co-located 1,131 s, training "
                   "331 s), so each instance adds more than the release's",
    "8B 2 inst x": "1.69x vs 1.4x (same)",
    "8B 1 inst T_seed": "396 s vs 190 s (the co-located rollout is twice the release's)",
    "8B 2 inst T_seed": "305 s vs 160 s (same)",
    "8B 3 inst T_seed": "253 s vs 105 s (same)",
    "8B 4 inst T_seed": "224 s vs 70 s (same)",
}


def _band_cases(figures):
  return [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[k]))
          if k in KNOWN_MISSES else k for k in figures]


@pytest.fixture(scope="module")
def full_calibration():
  # Every 14B calibration figure at the full plan (10 steps, 3 skipped; ~1-2 min on 2 cores)
  # and the release's 8B figures (five Qwen3-8B simulations).
  return {**points.calibration_points(FITTED, points.FULL, jobs=2),
          **points.release_points(FITTED, points.FULL, jobs=2)}


@_OPT_IN
@pytest.mark.parametrize("key", _band_cases(list(paper.CALIBRATION) + list(paper.CONTROLLER)
                                            + list(paper.RELEASE_8B)))
def test_calibration_figure_within_its_band(full_calibration, key):
  lo, hi = paper.BANDS[key]
  assert lo <= full_calibration[key] <= hi, (key, full_calibration[key], (lo, hi))


@_OPT_IN
def test_calibration_shapes(full_calibration):
  ours = full_calibration
  # each instance adds throughput, and the window shrinks with the count (14B and 8B)
  xs = [ours[f"8B {n} inst x"] for n in (1, 2, 3, 4)]
  ts = [ours[f"8B {n} inst T_seed"] for n in (1, 2, 3, 4)]
  assert 1.0 < xs[0] < xs[1] < xs[2] < xs[3] and ts[0] > ts[1] > ts[2] > ts[3]
  ws = [ours[f"14B {n} inst T_seed"] for n in range(1, 7)]
  assert all(a > b for a, b in zip(ws, ws[1:]))


def test_paper_table_puts_ours_beside_the_paper_with_the_band():
  table = paper.paper_table({"static 1 inst x": 1.233, "bamboo 8B x": 0.83,
                             "cap 14K N_prem": 6.4},
                            {**paper.CALIBRATION, **paper.CONTROLLER,
                             **paper.HELD_OUT}).splitlines()
  assert table[0].split() == ["figure", "paper", "band", "ours", "ratio", "met"]
  assert table[1].split() == ["static", "1", "inst", "x", "1.37", "1.23..1.51", "1.23", "0.90",
                              "yes"]
  assert table[2].split() == ["cap", "14K", "N_prem", "6.00", "4.00..8.00", "6.40", "1.07", "yes"]
  assert table[3].split() == ["bamboo", "8B", "x", "1.66", "1.41..1.91", "0.83", "0.50", "NO"]
  # the paper's cost figures: -22% per-token cost is 1 / 0.78 tokens per dollar
  assert paper.CALIBRATION["static 1 inst ce"] == pytest.approx(1.282, abs=1e-3)
  assert paper.CALIBRATION["static 6 inst x"] == pytest.approx(2.2468)
  # tokens/s and windows print as whole numbers
  rel = paper.paper_table({"8B colocated tok/s": 4079.4}, paper.RELEASE_8B).splitlines()
  assert rel[1].split() == ["8B", "colocated", "tok/s", "10,000", "7,000..13,000", "4,079",
                            "0.41", "NO"]
  # the release's figures are 2,000 tokens/s (0.2 x veRL's 10,000) per instance
  assert [paper.RELEASE_8B[f"8B {n} inst x"] for n in (1, 2, 3, 4)] == pytest.approx(
      [(10000 + 2000 * n) / 10000 for n in (1, 2, 3, 4)])
  # every band is two-sided and holds the paper's own value
  for key, (lo, hi) in paper.BANDS.items():
    value = {**paper.CALIBRATION, **paper.CONTROLLER, **paper.RELEASE_8B,
             **paper.HELD_OUT}[key]
    assert lo < hi and (value != value or lo <= value <= hi), key

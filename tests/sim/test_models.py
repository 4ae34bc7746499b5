"""Physical and cost models of the simulator: closed forms, monotonicity, presets, bad input."""
import itertools
import math

import numpy as np
import pytest

from jaxrl_sys import sim
from jaxrl_sys.rollout.manager.balance import plateau_batch as online_plateau_batch
from jaxrl_sys.sim import (COLD_VM, GCP_A3, PRESETS, QWEN3_8B, QWEN3_14B, QWEN3_32B, DecodeCurve,
                           Prices, Startup, plateau_batch)


@pytest.mark.parametrize("k", [1, 2, 4, 5, 9])
def test_transfer_time_with_a_shared_sender(k):
  nbytes, recv, send = 29.5e9, 50.0, 200.0
  expect = max(8 * nbytes / (recv * 1e9), k * 8 * nbytes / (send * 1e9))
  assert sim.transfer_time(nbytes, recv, k, send) == pytest.approx(expect, rel=1e-12)
  assert sim.transfer_time(nbytes, recv, k) == pytest.approx(8 * nbytes / 50e9)  # no sender cap
  assert sim.transfer_time(nbytes, recv, k, send, efficiency=0.5) == pytest.approx(2 * expect)


def test_weight_pull_matches_the_spec_bounds():
  # RLBOOST.md 1.4: >= 2.6 / 4.7 / 10.5 s at 50 Gbps; 14B to four instances from one
  # 200 Gbps node: >= 4.7 s (receiver- and sender-bound at once).
  for preset, lower in [(QWEN3_8B, 2.6), (QWEN3_14B, 4.7), (QWEN3_32B, 10.5)]:
    assert sim.weight_pull_time(preset) == pytest.approx(lower, abs=0.05)
  assert sim.weight_pull_time(QWEN3_14B, 4) == pytest.approx(4.73, abs=0.01)
  assert sim.weight_pull_time(QWEN3_14B, 8) == pytest.approx(2 * sim.weight_pull_time(QWEN3_14B, 4))
  times = [sim.weight_pull_time(QWEN3_8B, k, GCP_A3) for k in range(1, 12)]
  assert times == sorted(times)


def test_transfer_time_rejects_bad_input():
  for args in [(-1, 50), (1e9, 0), (1e9, 50, 0), (1e9, 50, 1, 0.0), (1e9, 50, 1, None, 1.5)]:
    with pytest.raises(ValueError):
      sim.transfer_time(*args)


def test_plateau_batch_of_a_known_knee():
  curve = DecodeCurve(fixed_s=1.0, per_seq_s=0.01)  # asymptote 100 tokens/s
  b = plateau_batch(curve, 0.9)
  assert b == 900  # 0.9 * a / (0.1 * k)
  assert curve.throughput(b) >= 90.0 > curve.throughput(b - 1)
  assert plateau_batch(curve, 0.5) == 100  # half the asymptote at batch a / k


def test_plateau_batch_agrees_with_brute_force():
  for a, k, m, frac, h in itertools.product([0.004, 0.02], [1e-5, 2e-4], [8, 64, 300],
                                            [0.5, 0.8, 0.9, 0.95], [0.0, 0.01, 0.03]):
    curve = DecodeCurve(fixed_s=a, per_seq_s=k, host_s=h)  # a step: max(h, a + k b)
    best = curve.throughput(m)
    brute = min(b for b in range(1, m + 1) if curve.throughput(b) >= frac * best * (1 - 1e-12))
    assert plateau_batch(curve, frac, max_batch=m) == brute


def test_plateau_batch_matches_the_managers_online_definition():
  curve, ctx, m = QWEN3_14B.decode, 3000.0, 150
  rows = [(b, 10 * b, 10 * curve.step_time(b, ctx)) for b in range(1, m + 1)]
  assert online_plateau_batch(np.array(rows), 0.9) == plateau_batch(curve, 0.9, ctx, max_batch=m)


def test_presets_follow_the_spec_and_the_models():
  assert [round(p.weight_bytes / 1e9, 1) for p in (QWEN3_8B, QWEN3_14B, QWEN3_32B)] == \
      [16.4, 29.5, 65.5]
  assert [p.params_b for p in (QWEN3_8B, QWEN3_14B, QWEN3_32B)] == pytest.approx(
      [8.19, 14.77, 32.76], abs=0.01)
  assert QWEN3_8B.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
  assert [p.train_nodes for p in (QWEN3_8B, QWEN3_14B, QWEN3_32B)] == [1, 1, 2]
  assert all(p.gpus_per_instance == 2 and p.gpus_per_node == 8 for p in PRESETS.values())
  assert sim.get_preset("Qwen3-14B") is QWEN3_14B
  with pytest.raises(ValueError, match="unknown model preset"):
    sim.get_preset("qwen3-70b")
  # Batch-1 decode is weight-read bound: bytes / (2 x 3.35 TB/s) plus fixed overheads.
  for p in PRESETS.values():
    floor = p.weight_bytes / (2 * 3.35e12)
    assert 1.3 * floor < sim.decode_step_time(p, 1) < 2.5 * floor


def test_decode_monotonicity_and_kv_capacity():
  for p in PRESETS.values():
    for ctx in (0.0, 1000.0, 8000.0):
      steps = [sim.decode_step_time(p, b, ctx) for b in range(1, 300, 7)]
      thr = [sim.decode_throughput(p, b, ctx) for b in range(1, 300, 7)]
      assert steps == sorted(steps) and thr == sorted(thr)
    assert sim.decode_step_time(p, 64, 4000) > sim.decode_step_time(p, 64, 1000)
    plateaus = [p.plateau_batch(ctx) for ctx in (500, 2000, 8000, 14000)]
    assert plateaus == sorted(plateaus, reverse=True)
    assert sim.max_decode_batch(p, 4000) * 4000 <= p.decode.kv_capacity_tokens
    assert p.plateau_batch(4000) <= sim.max_decode_batch(p, 4000)
  # Bigger models are slower per step at every batch.
  for b in (1, 32, 128):
    times = [sim.decode_step_time(p, b, 2000) for p in (QWEN3_8B, QWEN3_14B, QWEN3_32B)]
    assert times == sorted(times)


def test_prefill_time():
  p = QWEN3_14B
  assert sim.prefill_time(p, 0) == 0.0
  assert sim.prefill_time(p, 2000) < sim.prefill_time(p, 4000) < sim.prefill_time(p, 8000)
  # One 8K sequence costs more attention than eight 1K ones.
  assert sim.prefill_time(p, 8000) > sim.prefill_time(p, 8000, seq_len=1000)
  with pytest.raises(ValueError):
    sim.prefill_time(p, -1)


def test_train_time_is_linear_in_tokens_and_inverse_in_nodes():
  p = QWEN3_8B
  t1 = sim.train_time(p, 1_000_000, n_nodes=1, mean_seq_len=4000)
  assert sim.train_time(p, 3_000_000, 1, 4000) == pytest.approx(3 * t1)
  assert sim.train_time(p, 1_000_000, 4, 4000) == pytest.approx(t1 / 4)
  assert sim.train_time(p, 1_000_000, 1, 8000) > t1 > sim.train_time(p, 1_000_000, 1, 0)
  assert sim.train_time(QWEN3_32B, 10) == sim.train_time(QWEN3_32B, 10, 2)  # preset's nodes
  # 5 forward-equivalents of 2N FLOPs per token at 35% of 8 x 989 TFLOP/s.
  assert sim.train_throughput(p) == pytest.approx(8 * 989e12 * 0.35 / (5 * 2 * 8.1907e9))
  assert sim.step_overhead_time(p) > 0
  for bad in [dict(tokens=-1), dict(tokens=1, n_nodes=0), dict(tokens=1, mean_seq_len=-1)]:
    with pytest.raises(ValueError):
      sim.train_time(p, **bad)


def test_derive_preset_and_curve_validation():
  tiny = sim.ModelArch(params=1e9, num_layers=16, hidden=2048, num_heads=16, num_kv_heads=8,
                       head_dim=128)
  p = sim.derive_preset("tiny", tiny, train_mfu=0.7)
  assert sim.train_throughput(p) == pytest.approx(2 * sim.train_throughput(
      sim.derive_preset("tiny", tiny, train_mfu=0.35)))
  with pytest.raises(ValueError, match="do not fit"):
    sim.derive_preset("huge", sim.ModelArch(1e12, 100, 8192, 64, 8, 128))
  for bad in [dict(fixed_s=0.0, per_seq_s=1.0), dict(fixed_s=1.0, per_seq_s=0.0),
              dict(fixed_s=1.0, per_seq_s=-1.0)]:
    with pytest.raises(ValueError):
      DecodeCurve(**bad)
  with pytest.raises(ValueError):
    plateau_batch(QWEN3_8B.decode, frac=1.0)
  with pytest.raises(ValueError):
    sim.Hardware("x", 1.0, 1.0, 1.0, 1.0, weight_read_eff=1.5)


def test_prices_and_costs():
  pr = sim.RLBOOST_PRICES
  assert pr.on_demand_gpu_hour == pytest.approx(10.47, abs=0.01)
  assert pr.spot_gpu_hour == pytest.approx(2.66)
  assert pr.discount == pytest.approx(1 - 2.66 / 10.474, abs=1e-3)
  assert sim.reserved_cost(pr, 1.0) == pytest.approx(83.79)
  assert sim.spot_cost(pr, 1.0) == pytest.approx(5.32)
  # One node for 2 h plus 3 spot instances for 2 h.
  assert sim.run_cost(pr, 7200, 1, 3 * 7200) == pytest.approx(2 * 83.79 + 6 * 5.32)
  assert pr.with_discount(0.3).spot_gpu_hour == pytest.approx(0.7 * pr.on_demand_gpu_hour)
  assert pr.with_discount(0.0).discount == pytest.approx(0.0)
  assert sim.tokens_per_dollar(1e6, 10.0) == 1e5
  for bad in [lambda: Prices(0.0, 1.0), lambda: pr.with_discount(1.5),
              lambda: sim.reserved_cost(pr, -1), lambda: sim.spot_cost(pr, 1, 0),
              lambda: sim.tokens_per_dollar(1, 0)]:
    with pytest.raises(ValueError):
      bad()


def test_startup_delay():
  assert sim.startup_delay() == COLD_VM.total_s == 120.0
  assert sim.startup_delay(sim.WARM_RESTART) == 30.0
  s = Startup(jitter=0.25)
  draws = [sim.startup_delay(s, np.random.default_rng(i)) for i in range(200)]
  assert min(draws) >= 90.0 and max(draws) <= 150.0 and np.std(draws) > 5
  assert sim.startup_delay(s, np.random.default_rng(3)) == sim.startup_delay(
      s, np.random.default_rng(3))
  with pytest.raises(ValueError):
    Startup(provision_s=-1)
  assert math.isclose(sim.startup_delay(s), 120.0)

"""Response-length distribution (closed forms vs samples) and calibration from measurements."""
import numpy as np
import pytest

from jaxrl_sys import sim
from jaxrl_sys.sim import DecodeCurve, LengthDistribution

N = 200_000


def test_default_lengths_match_the_documented_figures():
  d = sim.REASONING_LENGTHS
  assert d.median * np.exp(d.sigma ** 2 / 2) == pytest.approx(6000, rel=0.01)  # unclipped mean
  assert d.mean() == pytest.approx(5300, rel=0.01)
  assert d.quantile(0.5) == pytest.approx(4000)
  assert d.quantile(0.9) == pytest.approx(12_700, rel=0.01)
  assert d.quantile(0.99) == d.max_tokens == 14_336
  assert d.cap_fraction() == pytest.approx(0.078, abs=0.001)


@pytest.mark.parametrize("dist", [LengthDistribution(), LengthDistribution(800, 1.3, 5000, 16),
                                  LengthDistribution(3000, 0.5, 1 << 20, 1, group_share=0.6)])
def test_samples_agree_with_closed_forms(dist):
  x = dist.sample(np.random.default_rng(0), N, group_size=8)
  assert x.dtype == np.int64 and x.min() >= dist.min_tokens and x.max() <= dist.max_tokens
  # Groups are correlated when group_share > 0, so allow for the reduced effective size.
  n_eff = N / (1 + 7 * dist.group_share)
  assert abs(x.mean() - dist.mean()) < 4 * x.std() / np.sqrt(n_eff) + 0.5
  for q in (0.1, 0.5, 0.9):
    frac_below = np.mean(x <= dist.quantile(q))
    assert abs(frac_below - q) < 4 * np.sqrt(q * (1 - q) / n_eff) + 1e-3
  assert np.mean(x == dist.max_tokens) == pytest.approx(dist.cap_fraction(), abs=0.01)


def test_sampling_is_seeded_and_groups_share_length():
  d = LengthDistribution(group_share=0.8)
  a = sim.sample_lengths(np.random.default_rng(5), 64, d, group_size=8)
  assert np.array_equal(a, sim.sample_lengths(np.random.default_rng(5), 64, d, group_size=8))
  assert not np.array_equal(a, sim.sample_lengths(np.random.default_rng(6), 64, d, 8))
  x = np.log(d.sample(np.random.default_rng(1), 8000 * 8, 8).reshape(-1, 8).astype(float))
  within = np.mean(np.var(x, axis=1, ddof=1))
  indep = np.log(LengthDistribution().sample(np.random.default_rng(1), 8000 * 8, 8)
                 .reshape(-1, 8).astype(float))
  assert within < 0.5 * np.mean(np.var(indep, axis=1, ddof=1))
  assert len(sim.sample_lengths(np.random.default_rng(0), 13, d, group_size=8)) == 13


def test_length_distribution_rejects_bad_parameters():
  for bad in [dict(median=0), dict(sigma=-1), dict(min_tokens=10, max_tokens=5),
              dict(group_share=1.5)]:
    with pytest.raises(ValueError):
      LengthDistribution(**bad)
  with pytest.raises(ValueError):
    LengthDistribution().quantile(1.0)
  with pytest.raises(ValueError):
    LengthDistribution().sample(np.random.default_rng(0), -1)


def synthetic_points(curve, batches, contexts, noise=0.0, seed=0):
  rng = np.random.default_rng(seed)
  return [(b, c, curve.throughput(b, c) * (1 + noise * rng.standard_normal()))
          for b in batches for c in contexts]


def test_calibration_recovers_a_synthetic_curve():
  truth = DecodeCurve(fixed_s=0.012, per_seq_s=3e-5, per_ctx_token_s=4e-8)
  fit = sim.fit_decode_curve(synthetic_points(truth, [1, 8, 32, 128, 256], [500, 2000, 6000]))
  assert (fit.fixed_s, fit.per_seq_s, fit.per_ctx_token_s) == pytest.approx(
      (truth.fixed_s, truth.per_seq_s, truth.per_ctx_token_s), rel=1e-6)
  noisy = sim.fit_decode_curve(synthetic_points(truth, [1, 4, 16, 64, 128, 256],
                                                [500, 2000, 6000], noise=0.01))
  assert noisy.fixed_s == pytest.approx(truth.fixed_s, rel=0.05)
  assert noisy.per_batch_s(3000) == pytest.approx(truth.per_batch_s(3000), rel=0.05)
  # One context: the slope at that context.
  two_col = [(b, truth.throughput(b, 1000)) for b in (1, 16, 64, 200)]
  one = sim.fit_decode_curve(two_col)
  assert one.per_ctx_token_s == 0 and one.per_seq_s == pytest.approx(truth.per_batch_s(1000))
  assert sim.plateau_batch(one, 0.9) == sim.plateau_batch(truth, 0.9, 1000)


def test_calibrate_from_measurement_builds_a_usable_preset():
  truth = DecodeCurve(fixed_s=0.004, per_seq_s=2e-4)
  p = sim.calibrate_from_measurement(
      "cpu", [(b, truth.throughput(b)) for b in (1, 8, 64)], train_tokens_per_s=500.0,
      prefill_tokens_per_s=4000.0, weight_bytes=10_000_000, kv_capacity_tokens=1 << 16)
  assert sim.decode_step_time(p, 8) == pytest.approx(truth.step_time(8))
  assert sim.prefill_time(p, 4000) == pytest.approx(1.0)
  assert sim.train_time(p, 1000) == pytest.approx(2.0)
  assert p.decode.kv_capacity_tokens == 1 << 16
  default_prefill = sim.calibrate_from_measurement(
      "cpu", [(b, truth.throughput(b)) for b in (1, 8, 64)], train_tokens_per_s=500.0,
      weight_bytes=1)
  assert default_prefill.prefill_s_per_token == pytest.approx(truth.per_seq_s)


def test_calibration_rejects_what_it_cannot_fit():
  with pytest.raises(ValueError, match="two batch sizes"):
    sim.fit_decode_curve([(8, 100.0), (8, 110.0)])
  with pytest.raises(ValueError):
    sim.fit_decode_curve([(0, 1.0), (2, 5.0)])
  with pytest.raises(ValueError):
    sim.calibrate_from_measurement("x", [(1, 1.0), (2, 1.5)], train_tokens_per_s=0.0,
                                   weight_bytes=1)


def benchmark_dicts():
  """The shapes benchmarks/generate.py, grpo_step.py and rollout_engine.py write."""
  truth = DecodeCurve(fixed_s=0.003, per_seq_s=1e-4, per_ctx_token_s=2e-7)
  config = dict(vocab_size=2048, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                head_dim=64, intermediate_size=768, max_seq_len=512, tie_embeddings=False,
                param_dtype="float32", compute_dtype="float32", rope="RopeConfig()", moe=None)
  generate = {"config": config, "rows": [
      {"batch": b, "new_tokens": 128, "ours_tok_s": truth.throughput(b, 16 + 64),
       "ours_step_ms": 1e3 * truth.step_time(b, 16 + 64)} for b in (1, 8, 64)]}
  grpo = {"step_throughput": {"train_response_tokens_per_s": 2500.0, "other_s": 0.4,
                              "rollout_tokens_per_s": 900.0}}
  engine = {"load": {"requests": 512, "tokens": 512 * 60},
            "results": [{"method": "engine", "tokens_per_s": truth.throughput(40, 70),
                         "stats": {"decode_row_steps": 4000, "decode_steps": 100}},
                        {"method": "static_generate", "tokens_per_s": 1.0}]}
  return truth, generate, grpo, engine


def test_calibrate_from_benchmark_json():
  truth, generate, grpo, engine = benchmark_dicts()
  p = sim.calibrate_from_benchmarks(generate, grpo, engine)
  assert (p.decode.fixed_s, p.decode.per_seq_s, p.decode.per_ctx_token_s) == pytest.approx(
      (truth.fixed_s, truth.per_seq_s, truth.per_ctx_token_s), rel=1e-6)
  assert sim.train_throughput(p) == pytest.approx(2500.0) and p.step_overhead_s == 0.4
  params, wbytes, kvb = sim.dense_config_sizes(generate["config"])
  per_layer = 256 * 64 * (2 * 4 + 2 * 2) + 3 * 256 * 768 + 2 * 256
  assert params == 2 * 2048 * 256 + 4 * per_layer + 256
  assert (p.weight_bytes, wbytes, kvb) == (4 * params, 4 * params, 2 * 4 * 2 * 64 * 4)
  without_engine = sim.calibrate_from_benchmarks(generate, grpo)
  assert without_engine.decode.per_ctx_token_s == 0.0  # one context only
  with pytest.raises(ValueError, match="benchmark field"):
    sim.calibrate_from_benchmarks({"rows": []}, grpo)

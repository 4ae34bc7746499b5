"""jaxrl_sys.sim: physical and cost models of a reserved cluster + spot rollout pool.

Pure functions and frozen dataclasses (numpy only); the discrete-event driver that runs the
real rollout manager on a virtual clock is built on top of them. Every figure's source is in
`sim/README.md`. Units: seconds, bytes, tokens, Gbit/s for links, dollars per GPU-hour.

- `hardware`: `Hardware` (GPU figures and efficiencies; `H100`), `Network` (frontend NICs;
  `GCP_A3`: 200 Gbps per 8xH100 node, 50 Gbps per 2xH100 instance).
- `decode`: `DecodeCurve` (step time = max(host, fixed + per_seq * batch + per_ctx_token *
  batch * ctx), KV capacity) and `plateau_batch(curve, frac, mean_context, max_batch)` (B).
- `presets`: `ModelArch`, `ModelPreset`, `derive_preset(...)`, `QWEN3_8B`, `QWEN3_14B`,
  `QWEN3_32B`, `PRESETS`, `get_preset(name)`.
- `timing`: `decode_step_time`, `decode_throughput`, `max_decode_batch`, `prefill_time`,
  `train_time`, `train_throughput`, `step_overhead_time`.
- `network`: `transfer_time(bytes, link_gbps, n_concurrent_receivers, sender_gbps)` (sender NIC
  sharing) and `weight_pull_time(preset, n_concurrent_receivers, network)`.
- `startup`: `Startup`, `COLD_VM`, `WARM_RESTART`, `startup_delay(startup, rng)`.
- `prices`: `Prices` (RLBoost's averages: $10.47 on-demand, $2.66 spot per GPU-hour),
  `reserved_cost`, `spot_cost`, `run_cost`, `tokens_per_dollar`.
- `lengths`: `LengthDistribution` (clipped log-normal, median 4K, sigma 0.9, cap 14,336),
  `sample_lengths(rng, n, dist, group_size)`.
- `calibrate`: `fit_decode_curve`, `calibrate_from_measurement(...)`,
  `calibrate_from_benchmarks(generate, grpo_step, rollout_engine)` (our benchmarks' JSON).

- `fit`: `InstanceFit` (decode / attention / prefill scales, host time per step, lengths,
  memory fraction, batch cap, training scale), `FITTED` (fitted to RLBoost's static-pool points
  and to what its controller settles on), `ROOFLINE`, `fitted_presets()`.
- `points`: ours for the calibration figures (`calibration_points`, `release_points`,
  `static_pool`, `pool_config`; plans `FULL` and `FAST`); `held_out`: ours for the held-out ones
  (`bamboo_table`, `ablations`, `break_even`); `paper`: RLBoost's figures (`CALIBRATION`,
  `CONTROLLER`, `RELEASE_8B`, `HELD_OUT`), their two-sided `BANDS`, `paper_table`,
  `paper_report`.
Spot traces (parsing, segments, sampling, replay) are in `jaxrl_sys.rollout.elastic.traces`;
the file formats in `jaxrl_sys.rollout.elastic.trace_formats`.
"""
from jaxrl_sys.sim.calibrate import (calibrate_from_benchmarks, calibrate_from_measurement,
                                     dense_config_sizes, fit_decode_curve)
from jaxrl_sys.sim.decode import DecodeCurve, plateau_batch
from jaxrl_sys.sim.hardware import GCP_A3, H100, Hardware, Network
from jaxrl_sys.sim.lengths import REASONING_LENGTHS, LengthDistribution, sample_lengths
from jaxrl_sys.sim.network import transfer_time, weight_pull_time
from jaxrl_sys.sim.presets import (PRESETS, QWEN3_8B, QWEN3_14B, QWEN3_32B, ModelArch,
                                   ModelPreset, derive_preset, get_preset)
from jaxrl_sys.sim.prices import (RLBOOST_PRICES, Prices, reserved_cost, run_cost, spot_cost,
                                  tokens_per_dollar)
from jaxrl_sys.sim.startup import COLD_VM, WARM_RESTART, Startup, startup_delay
from jaxrl_sys.sim.timing import (decode_step_time, decode_throughput, max_decode_batch,
                                  prefill_time, step_overhead_time, train_throughput, train_time)

__all__ = [
    "COLD_VM", "GCP_A3", "H100", "PRESETS", "QWEN3_8B", "QWEN3_14B", "QWEN3_32B",
    "REASONING_LENGTHS", "RLBOOST_PRICES", "WARM_RESTART", "DecodeCurve", "Hardware",
    "LengthDistribution", "ModelArch", "ModelPreset", "Network", "Prices", "Startup",
    "calibrate_from_benchmarks", "calibrate_from_measurement", "decode_step_time",
    "decode_throughput", "dense_config_sizes", "derive_preset", "fit_decode_curve", "get_preset",
    "max_decode_batch", "plateau_batch", "prefill_time", "reserved_cost", "run_cost",
    "sample_lengths", "spot_cost", "startup_delay", "step_overhead_time", "tokens_per_dollar",
    "train_throughput", "train_time", "transfer_time", "weight_pull_time",
]

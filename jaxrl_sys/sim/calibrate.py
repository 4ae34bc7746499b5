"""Presets from measurements of our own engine and trainer instead of derived figures.

`calibrate_from_measurement` fits the decode step-time model
`t = fixed_s + per_seq_s * batch + per_ctx_token_s * batch * ctx` to measured (batch,
[context,] tokens/s) points (least squares on step time relative to itself, coefficients kept
>= 0) and takes prefill / training rates as given. `calibrate_from_benchmarks` reads the JSON
the benchmark scripts write (`benchmarks/results/generate.json`, `grpo_step.json`,
`rollout_engine.json`, parsed into dicts) and calls it.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from jaxrl_sys.sim.decode import DecodeCurve
from jaxrl_sys.sim.presets import ModelPreset

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def fit_decode_curve(points: Sequence[Sequence[float]], kv_capacity_tokens: int = 0) -> DecodeCurve:
  """Fits a `DecodeCurve` to `points` of `(batch, tokens_per_s)` or `(batch, mean_context,
  tokens_per_s)`. The context term is fitted only when the points have two or more contexts.

  Raises ValueError with fewer than two batch sizes, non-positive rates, or when no
  non-negative fit has a positive slope (throughput that does not saturate cannot be modelled).
  """
  pts = np.asarray(points, np.float64)
  if pts.ndim != 2 or pts.shape[1] not in (2, 3):
    raise ValueError(f"fit_decode_curve: points must be (batch, [context,] tokens/s) rows, got "
                     f"shape {pts.shape}")
  if pts.shape[1] == 2:
    pts = np.stack([pts[:, 0], np.zeros(len(pts)), pts[:, 1]], 1)
  batch, ctx, rate = pts.T
  if np.any(batch <= 0) or np.any(rate <= 0) or np.any(ctx < 0):
    raise ValueError("fit_decode_curve: batch and tokens/s must be > 0 and context >= 0")
  if len(np.unique(batch)) < 2:
    raise ValueError("fit_decode_curve: need at least two batch sizes")
  step = batch / rate
  cols = [np.ones_like(batch), batch] + ([batch * ctx] if len(np.unique(ctx)) > 1 else [])
  a = np.stack(cols, 1) / step[:, None]  # relative residuals: (model - step) / step
  best, best_err = None, np.inf
  for k in range(1, len(cols) + 1):
    for subset in itertools.combinations(range(len(cols)), k):
      coef, *_ = np.linalg.lstsq(a[:, subset], np.ones(len(step)), rcond=None)
      if np.any(coef < 0):
        continue
      full = np.zeros(3)
      full[list(subset)] = coef
      err = float(np.sum((a @ full[:len(cols)] - 1) ** 2))
      if full[1] + full[2] > 0 and err < best_err - 1e-15:
        best, best_err = full, err
  if best is None:
    raise ValueError("fit_decode_curve: no fit with non-negative coefficients and a positive "
                     "slope (does step time grow with the batch?)")
  fixed = max(best[0], 1e-12)
  return DecodeCurve(fixed, best[1], best[2], int(kv_capacity_tokens))


def calibrate_from_measurement(name: str, decode_points: Sequence[Sequence[float]], *,
                               train_tokens_per_s: float,
                               prefill_tokens_per_s: float | None = None,
                               weight_bytes: int, kv_bytes_per_token: int = 0,
                               kv_capacity_tokens: int = 0, params: float = 0.0,
                               num_layers: int = 0, hidden: int = 0, train_nodes: int = 1,
                               step_overhead_s: float = 0.0, prefill_call_s: float = 0.0,
                               gpus_per_instance: int = 1, gpus_per_node: int = 1) -> ModelPreset:
  """A preset from measured figures of one engine (an "instance") and one trainer ("node").

  Args:
    decode_points: `(batch, tokens_per_s)` or `(batch, mean_context, tokens_per_s)` rows.
    train_tokens_per_s: trained tokens/s of `train_nodes` nodes (all passes of an RL step).
    prefill_tokens_per_s: prefill tokens/s; None = estimated as `1 / per_seq_s` of the fitted
      decode curve (a prefilled token costs one sequence-step of decode compute).
    weight_bytes, kv_bytes_per_token, kv_capacity_tokens, params, num_layers, hidden: sizes
      (params in units, not billions).
    step_overhead_s: measured per-step time outside rollout and training.
  """
  if not train_tokens_per_s > 0 or (prefill_tokens_per_s is not None
                                    and not prefill_tokens_per_s > 0):
    raise ValueError("calibrate_from_measurement: rates must be > 0")
  curve = fit_decode_curve(decode_points, kv_capacity_tokens)
  pts = np.asarray(decode_points, np.float64)
  ctx_mean = float(pts[:, 1].mean()) if pts.shape[1] == 3 else 0.0
  prefill_s = (1.0 / prefill_tokens_per_s if prefill_tokens_per_s
               else curve.per_seq_s or curve.per_batch_s(ctx_mean))
  return ModelPreset(
      name=name, params_b=params / 1e9, num_layers=num_layers, hidden=hidden,
      weight_bytes=int(weight_bytes), kv_bytes_per_token=int(kv_bytes_per_token), decode=curve,
      prefill_s_per_token=prefill_s, prefill_attn_s=0.0, prefill_call_s=prefill_call_s,
      train_s_per_token=train_nodes / train_tokens_per_s, train_attn_s=0.0,
      train_nodes=train_nodes, step_overhead_s=max(step_overhead_s, 0.0),
      gpus_per_instance=gpus_per_instance, gpus_per_node=gpus_per_node)


def dense_config_sizes(config: Mapping) -> tuple[float, int, int]:
  """`(params, weight_bytes, kv_bytes_per_token)` of a dense `models.ModelConfig` written as a
  dict (the `config` of generate.json)."""
  v, h, layers = config["vocab_size"], config["hidden_size"], config["num_layers"]
  heads, kv, hd, ffn = (config["num_heads"], config["num_kv_heads"], config["head_dim"],
                        config["intermediate_size"])
  per_layer = h * hd * (2 * heads + 2 * kv) + 3 * h * ffn + 2 * h
  params = v * h * (1 if config.get("tie_embeddings") else 2) + layers * per_layer + h
  wbytes = _DTYPE_BYTES.get(config.get("param_dtype", "float32"), 4)
  cbytes = _DTYPE_BYTES.get(config.get("compute_dtype", "float32"), 4)
  return float(params), int(params * wbytes), 2 * layers * kv * hd * cbytes


def calibrate_from_benchmarks(generate: Mapping, grpo_step: Mapping,
                              rollout_engine: Mapping | None = None, name: str = "measured",
                              prompt_len: int = 16, engine_mean_prompt: float = 40.0,
                              kv_capacity_tokens: int = 0) -> ModelPreset:
  """A preset from the benchmark JSON files (as dicts).

  Keys read:
    generate: `config` (model shape and dtypes) and `rows[*]` `batch`, `new_tokens`,
      `ours_tok_s` -> decode points at context `prompt_len + new_tokens / 2` (`prompt_len` is
      the script's default, not written to the JSON).
    grpo_step: `step_throughput.train_response_tokens_per_s` (trained response tokens/s, so the
      calibrated cost is per response token) and `step_throughput.other_s` (step overhead).
    rollout_engine (optional): the `results` row with `method == "engine"`: one more decode
      point at batch `stats.decode_row_steps / stats.decode_steps` (mean decoded rows) and
      context `engine_mean_prompt + load.tokens / load.requests / 2`, rate `tokens_per_s`.
      That rate includes prefill and scheduling (an effective decode rate).
  """
  try:
    points = [(r["batch"], prompt_len + r["new_tokens"] / 2, r["ours_tok_s"])
              for r in generate["rows"]]
    params, wbytes, kvb = dense_config_sizes(generate["config"])
    thr = grpo_step["step_throughput"]
    train_rate, overhead = thr["train_response_tokens_per_s"], thr.get("other_s", 0.0)
    if rollout_engine is not None:
      eng = next(r for r in rollout_engine["results"] if r["method"] == "engine")
      load = rollout_engine["load"]
      rows = eng["stats"]["decode_row_steps"] / eng["stats"]["decode_steps"]
      points.append((rows, engine_mean_prompt + load["tokens"] / load["requests"] / 2,
                     eng["tokens_per_s"]))
  except (KeyError, TypeError, StopIteration, ZeroDivisionError) as err:
    raise ValueError(f"calibrate_from_benchmarks: missing or bad benchmark field: {err!r}") \
        from None
  return calibrate_from_measurement(
      name, points, train_tokens_per_s=train_rate, weight_bytes=wbytes, kv_bytes_per_token=kvb,
      kv_capacity_tokens=kv_capacity_tokens, params=params,
      num_layers=generate["config"]["num_layers"], hidden=generate["config"]["hidden_size"],
      step_overhead_s=overhead)

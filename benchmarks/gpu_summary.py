"""Issue 45's GPU targets checked against `benchmarks.gpu` results: one compact table.

    python -m benchmarks.gpu_summary benchmarks/results/gpu_h100-80gb-hbm3_*.json

Reads one or more JSON files of `benchmarks.gpu` (sections may be in separate files), prints
the measured rows compactly (the auto choice marked), the decode / train profile totals, and
one line per target: what was measured, the goal, met or not. The targets (one H100/H200, bf16,
the shapes of `benchmarks.gpu`):

- fused log-probs fwd+bwd: auto no slower than the naive full-logits path, at <= 1/8 of its
  compiled temp memory;
- flash attention fwd+bwd (causal): auto no slower than cuDNN;
- grouped matmul fwd+bwd: auto >= 70% of the equal-group einsum rate, temp <= 2x the
  activations (`x [m, d]` + `out [m, f]`, bf16);
- decode (0.5B, each batch): >= 50% of the HBM roofline;
- train step as the CLI runs it (the micro-batched row: 32 x 8 x (32+256)): fits, MFU >= 35%
  dense and >= 25% MoE;
- the agentic episodes with heavy-tailed tool latency (issue 42's goal): async >= 1.5x the
  turn barrier's episodes/s and >= 80% of the overlap bound.

Reported without a goal ("reported"): the engine's decode with unmerged LoRA adapters against
the plain model, MoE decode with route capture on against off, the agentic idle fractions.
"""
from __future__ import annotations

import json
import re
import sys

from benchmarks.common import print_table

LOGPROBS_MEM_FRACTION = 1 / 8
GMM_RATE_FRACTION = 0.70
GMM_TEMP_VS_ACTIVATIONS = 2.0
DECODE_ROOFLINE = 0.50
TRAIN_MFU = {"dense": 0.35, "moe": 0.25}
AGENTIC_SPEEDUP = 1.5      # issue 42: heavy-tailed tool latency, async vs turn barrier
AGENTIC_OF_BOUND = 0.80    # issue 42: fraction of the overlap bound
# The train rows run as the CLI's micro-batches ("2 x 16 groups"; `benchmarks.gpu_train`), or
# the failed attempt at them ("m_b=16").
MICRO_ROW = re.compile(r"\d+ x \d+ groups|m_b=\d+")


def load(paths: list[str]) -> tuple[list[dict], dict, dict]:
  """(rows, profile totals, device info) of the JSON files, in order."""
  rows, totals, device = [], {}, {}
  for path in paths:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    rows += data.get("rows", [])
    totals |= data.get("profile_totals", {})
    device = device or data.get("device", {})
  return rows, totals, device


def _auto(rows: list[dict], name: str, shape_has: str = "") -> dict | None:
  return next((r for r in rows if r.get("section") == "kernel" and r.get("name") == name
               and r.get("auto") and shape_has in r.get("shape", "")), None)


def _impl(rows: list[dict], name: str, impl: str, shape_has: str = "") -> dict | None:
  return next((r for r in rows if r.get("section") == "kernel" and r.get("name") == name
               and r.get("impl") == impl and shape_has in r.get("shape", "")), None)


def _line(target: str, measured: str, goal: str, met: bool | str | None) -> dict:
  """met: True / False (the goal), None (not measured: "n/a") or a word ("reported")."""
  if met is None or isinstance(met, bool):
    met = "n/a" if met is None else ("yes" if met else "NO")
  return {"target": target, "measured": measured, "goal": goal, "met": met}


def _missing(target: str, goal: str, why: str) -> dict:
  return _line(target, why, goal, None)


def _timed(r: dict | None) -> bool:
  return bool(r) and "fwdbwd_ms" in r


def check(rows: list[dict]) -> list[dict]:
  """One line per target: {target, measured, goal, met ("yes" / "NO" / "n/a": not measured)}."""
  out = []
  # Fused log-probs.
  auto, naive = _auto(rows, "fused_logprobs"), _impl(rows, "fused_logprobs", "naive")
  goal = f"<= naive ms, <= 1/{round(1 / LOGPROBS_MEM_FRACTION)} naive temp"
  if _timed(auto) and _timed(naive):
    t, m = auto["fwdbwd_ms"] / naive["fwdbwd_ms"], auto["fwdbwd_temp_mib"] / max(
        naive["fwdbwd_temp_mib"], 1e-9)
    out.append(_line("fused log-probs fwd+bwd",
                     f"{auto['impl']} {auto['fwdbwd_ms']:.3g} ms ({t:.2f}x naive), "
                     f"temp {m:.3f}x naive", goal, t <= 1.0 and m <= LOGPROBS_MEM_FRACTION))
  else:
    out.append(_missing("fused log-probs fwd+bwd", goal, "no auto or naive row"))
  fused = [r for r in rows if r.get("section") == "kernel" and r.get("name") == "fused_logprobs"
           and r.get("impl") != "naive" and _timed(r)]
  best = min(fused, key=lambda r: r["fwdbwd_ms"], default=None)
  if best is not None and _timed(naive) and best is not auto:   # a faster path than auto
    t, m = best["fwdbwd_ms"] / naive["fwdbwd_ms"], best["fwdbwd_temp_mib"] / max(
        naive["fwdbwd_temp_mib"], 1e-9)
    meets = t <= 1.0 and m <= LOGPROBS_MEM_FRACTION
    out.append(_line("fused log-probs: fastest fused path",
                     f"{best['impl']} {best['fwdbwd_ms']:.3g} ms ({t:.2f}x naive), temp "
                     f"{m:.3f}x naive", goal, "make it auto" if meets else "reported"))
  # Flash attention (causal layout).
  auto, cudnn = _auto(rows, "flash_attention", "causal"), _impl(rows, "flash_attention",
                                                                 "cudnn", "causal")
  if _timed(auto) and _timed(cudnn):
    t = auto["fwdbwd_ms"] / cudnn["fwdbwd_ms"]
    out.append(_line("flash attention fwd+bwd", f"{auto['impl']} {auto['fwdbwd_ms']:.3g} ms "
                     f"({t:.2f}x cuDNN)", "<= cuDNN ms", t <= 1.0))
  else:
    out.append(_missing("flash attention fwd+bwd", "<= cuDNN ms", "no auto or cuDNN row"))
  # Grouped matmul.
  auto = _auto(rows, "grouped_matmul")
  goal = (f">= {GMM_RATE_FRACTION:.0%} einsum rate, temp <= {GMM_TEMP_VS_ACTIVATIONS:g}x "
          "activations")
  if _timed(auto) and "vs_naive" in auto:
    dims = dict(re.findall(r"\b([mdf])(\d+)\b", auto.get("shape", "")))
    act_mib = (int(dims.get("m", 0)) * (int(dims.get("d", 0)) + int(dims.get("f", 0))) * 2
               / 2 ** 20)
    temp_x = auto["fwdbwd_temp_mib"] / act_mib if act_mib else float("inf")
    out.append(_line("grouped matmul fwd+bwd",
                     f"{auto['impl']} {auto['fwdbwd_ms']:.3g} ms ({auto['vs_naive']:.0%} of "
                     f"einsum), temp {temp_x:.2f}x activations", goal,
                     auto["vs_naive"] >= GMM_RATE_FRACTION and temp_x <= GMM_TEMP_VS_ACTIVATIONS))
  else:
    out.append(_missing("grouped matmul fwd+bwd", goal, "no timed auto row"))
  # Decode.
  decode = [r for r in rows if r.get("section") == "decode" and r.get("impl") == "auto"]
  for r in decode or [None]:
    goal = f">= {DECODE_ROOFLINE:.0%} of HBM roofline"
    if r is None or r.get("roofline_frac") is None:
      out.append(_missing("decode", goal, "no decode row with an HBM figure"))
      continue
    out.append(_line(f"decode {r['shape']}", f"{r['roofline_frac']:.1%} ({r['step_ms']:.3g} "
                     f"ms/step, {r['tok_per_s']:.0f} tok/s)", goal,
                     r["roofline_frac"] >= DECODE_ROOFLINE))
  # Train step as the CLI runs it (the micro-batched rows).
  for kind, model in (("dense", "dense"), ("moe", "MoE")):
    mine = [r for r in rows if r.get("section") == "train" and model in r.get("name", "")
            and MICRO_ROW.fullmatch(str(r.get("impl")))]
    goal = f"fits, MFU >= {TRAIN_MFU[kind]:.0%}"
    if not mine:
      out.append(_missing(f"train {kind} (CLI micro-batches)", goal, "no row"))
    for r in mine:
      target = f"train {kind} {r['shape']} {r['impl']}"
      if r.get("error"):
        out.append(_line(target, r["error"][:60], goal, False))
      else:
        out.append(_line(target, f"MFU {r['mfu']:.1%} ({r['step_ms']:.4g} ms/step)", goal,
                         r["mfu"] >= TRAIN_MFU[kind]))
  return out + features(rows)


NO_GOAL = "none stated"


def _rows(rows: list[dict], section: str) -> list[dict]:
  return [r for r in rows if r.get("section") == section]




def features(rows: list[dict]) -> list[dict]:
  """The lines of issue 45's feature rows (`benchmarks.gpu_features`): LoRA decode, MoE route
  capture (reported), the agentic episodes (issue 42's goal at heavy-tailed latency)."""
  out = []
  lora = _rows(rows, "lora")
  plain = next((r for r in lora if r.get("impl") == "plain" and "step_ms" in r), None)
  for r in [r for r in lora if r.get("impl") != "plain"] or [None]:
    target = "decode LoRA " + ("" if r is None else f"{r.get('impl')} {r.get('shape')}")
    if r is None or "step_ms" not in r or plain is None:
      why = "no row" if r is None else (r.get("error") or "no plain row")[:60]
      out.append(_line(target.strip(), why, "reported vs plain", None if r is None else False))
      continue
    roof = ("" if None in (r.get("roofline_frac"), plain.get("roofline_frac")) else
            f", HBM roofline {r['roofline_frac']:.1%} vs {plain['roofline_frac']:.1%}")
    out.append(_line(target, f"{r['vs_base']:.2f}x plain step: {r['tok_per_s']:.4g} vs "
                     f"{plain['tok_per_s']:.4g} tok/s{roof}", NO_GOAL, "reported"))
  routes = {r.get("impl"): r for r in _rows(rows, "routes")}
  on, off = routes.get("capture on"), routes.get("capture off")
  if on and off and "step_ms" in on and "step_ms" in off:
    out.append(_line(f"MoE decode route capture {on['shape']}",
                     f"{on['capture_overhead_pct']:+.1f}% per step ({on['step_ms']:.3g} vs "
                     f"{off['step_ms']:.3g} ms)", NO_GOAL, "reported"))
  else:
    err = next((r["error"] for r in _rows(rows, "routes") if r.get("error")), None)
    out.append(_line("MoE decode route capture", (err or "no rows")[:60], "reported on vs off",
                     False if err else None))
  agentic = _rows(rows, "agentic")
  goal = (f">= {AGENTIC_SPEEDUP:g}x barrier, >= {AGENTIC_OF_BOUND:.0%} of bound (issue 42)")
  for r in agentic or [None]:
    if r is None or r.get("error"):
      out.append(_line("agentic episodes", "no rows" if r is None else r["error"][:60], goal,
                       None if r is None else False))
      continue
    heavy = r.get("tool_latency") == "heavy"
    same = "" if r["same_tokens"] == 1 else f", {r['same_tokens']:.0%} same tokens"
    out.append(_line(f"agentic {r['impl']} ({r['shape']})",
                     f"{r['speedup']:.2f}x ({r['async_ep_per_s']:.3g} vs "
                     f"{r['barrier_ep_per_s']:.3g} ep/s), idle {r['async_idle']:.0%} vs "
                     f"{r['barrier_idle']:.0%}, {r['of_bound']:.0%} of bound{same}",
                     goal if heavy else NO_GOAL,
                     (r["speedup"] >= AGENTIC_SPEEDUP and r["of_bound"] >= AGENTIC_OF_BOUND)
                     if heavy else "reported"))
  return out


ROW_COLUMNS = ("section", "name", "impl", "auto", "shape", "fwdbwd_ms", "vs_naive",
               "fwdbwd_temp_mib", "step_ms", "roofline_frac", "kernels_per_step",
               "copy_mib_per_step", "write_mib_per_step", "mfu", "vs_base", "error")


def main(argv=None) -> list[dict]:
  paths = list(sys.argv[1:] if argv is None else argv)
  if not paths:
    raise SystemExit("usage: python -m benchmarks.gpu_summary RESULT.json [...]")
  rows, totals, device = load(paths)
  print(f"device {device.get('device')} jax {device.get('jax')} auto {device.get('auto')}")
  if rows:
    compact = [{k: (r.get(k, "") if k != "error" else r.get(k, "")[:50]) for k in ROW_COLUMNS}
               for r in rows]
    print_table(compact, [c for c in ROW_COLUMNS if any(r.get(c) not in (None, "")
                                                        for r in rows)])
  for what, tot in totals.items():
    print(f"profile {what}: " + ", ".join(f"{k} {v:.4g}" for k, v in tot.items()))
  for r in rows:   # where a decode step's bytes are written (benchmarks.hlo_stats)
    for loop, writes in (r.get("largest_writes") or {}).items():
      print(f"largest writes {r['impl']} {r['shape']} {loop}: " + ", ".join(
          f"{name} ({op}) {mib:.3g} MiB" for name, op, mib in writes[:3]))
  lines = check(rows)
  print_table(lines)
  return lines


if __name__ == "__main__":
  main()

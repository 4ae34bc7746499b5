"""Tables, ratios and plots of a grid of simulated runs (rows from `experiment.run_grid`).

Ratios are against the co-located baseline of the same preset (RLBoost's metric: throughput x,
and cost efficiency = tokens per dollar, as +%); per-segment ratios are averaged over segments,
as RLBoost averages its segments A, B, C.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from jaxrl_sys.sim.settings import SETTINGS


def _index(rows: Sequence[dict]) -> dict[tuple, dict]:
  return {(r["preset"], r["setting"], r["segment"]): r["result"] for r in rows}


def _get(idx, preset, setting, seg):
  return idx.get((preset, setting, seg)) or idx.get((preset, setting, None))


def summarize(rows: Sequence[dict], seg_names: Sequence[str]) -> dict[str, Any]:
  """Per preset and setting: per-segment and mean throughput, $/Mtok and ratios to co-located."""
  idx = _index(rows)
  presets = list(dict.fromkeys(r["preset"] for r in rows))
  settings = list(dict.fromkeys(r["setting"] for r in rows))
  out: dict[str, Any] = {}
  for p in presets:
    base = idx[(p, "colocated", None)]
    if not base["steps"]:
      raise ValueError(
          f"preset {p}: the co-located baseline completed no RL step within the horizon (one "
          "step takes longer: a slow or calibrated-from-CPU preset with the default 128 x 8 "
          "long responses); shorten "
          "the responses (--length_median), or lengthen the segments (--segment_hours)")
    per = {}
    for s in settings:
      segs = {}
      for seg in seg_names:
        r = _get(idx, p, s, seg)
        if r is None:
          continue
        segs[seg] = {"throughput": r["throughput"], "cost_per_mtok": r["cost_per_mtok"],
                     "x_throughput": r["throughput"] / base["throughput"],
                     "cost_eff": r["tokens_per_dollar"] / base["tokens_per_dollar"] - 1.0,
                     "steps": len(r["steps"]),
                     # time averages over the run's completed steps (`SimResult`)
                     "spot_available": r.get("spot_available", float("nan")),
                     "workers_used": r.get("spot_used", float("nan")),
                     "t_seed": _mean([x["t_seed"] for x in r["steps"][1:]])}
      per[s] = {"segments": segs, "mean": {k: _mean([v[k] for v in segs.values()])
                                           for k in next(iter(segs.values()), {})}}
    out[p] = per
  return out


def _mean(xs: Sequence[float]) -> float:
  xs = [x for x in xs if x is not None and math.isfinite(x)]
  return sum(xs) / len(xs) if xs else float("nan")


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
  widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
  line = lambda row: "  ".join(str(x).rjust(w) if i else str(x).ljust(w)  # noqa: E731
                               for i, (x, w) in enumerate(zip(row, widths)))
  return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])


SPOT_LEGEND = ("avail: spot instances the trace makes available; used: spot instances the "
               "fleet runs (start-up included); both are time averages over the completed steps "
               "of the RLBoost run")


def segment_table(summary: dict, preset: str, seg_names: Sequence[str]) -> str:
  """RLBoost vs co-located for one preset, one row per segment, then the mean; `SPOT_LEGEND`
  says what the two instance columns average."""
  per = summary[preset]
  co, rl = per["colocated"], per["rlboost"]
  body = []
  for seg in list(seg_names) + ["mean"]:
    c = co["mean"] if seg == "mean" else co["segments"][seg]
    r = rl["mean"] if seg == "mean" else rl["segments"][seg]
    body.append([seg, f"{r['spot_available']:.1f}", f"{r['workers_used']:.1f}",
                 f"{c['throughput']:,.0f}",
                 f"{r['throughput']:,.0f}", f"{r['x_throughput']:.2f}x",
                 f"{c['cost_per_mtok']:.2f}", f"{r['cost_per_mtok']:.2f}",
                 f"{100 * r['cost_eff']:+.0f}%", f"{r['t_seed']:.0f}"])
  return _table(["segment", "spot avail", "used", "veRL tok/s", "RLBoost tok/s", "thr",
                 "veRL $/Mtok", "RLBoost $/Mtok", "cost eff", "T_seed s"], body)


def settings_table(summary: dict) -> str:
  """Every setting, mean over segments, per preset: throughput ratio and cost efficiency."""
  presets = list(summary)
  settings = list(dict.fromkeys(s for p in presets for s in summary[p]))
  body = []
  for s in settings:
    row = [SETTINGS[s].label if s in SETTINGS else s]
    for p in presets:
      m = summary[p].get(s, {}).get("mean", {})
      row += [f"{m.get('throughput', float('nan')):,.0f}", f"{m.get('x_throughput', 0):.2f}x",
              f"{m.get('cost_per_mtok', float('nan')):.2f}",
              f"{100 * m.get('cost_eff', float('nan')):+.0f}%"]
    body.append(row)
  header = ["setting"] + [f"{p} {c}" for p in presets
                          for c in ("tok/s", "thr", "$/Mtok", "cost eff")]
  return _table(header, body)


def plot(rows: Sequence[dict], preset: str, seg_names: Sequence[str], path: str,
         settings: Sequence[str] = ("rlboost",)) -> None:
  """Per segment (columns): live spot instances (available and used), T_seed and step time per
  step (rows), for `settings` and the co-located baseline's step time."""
  # A bare Figure, not pyplot: the caller's backend (a notebook's inline one) stays as it is.
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  idx = _index(rows)
  n = max(len(seg_names), 1)
  fig = Figure(figsize=(3.2 * n, 7.5))
  ax = fig.subplots(3, n, sharex=True, squeeze=False)
  for j, seg in enumerate(seg_names):
    for s in settings:
      r = _get(idx, preset, s, seg)
      if r is None:
        continue
      t = [x / 60 for x in r["series"]["t"]]
      if s == settings[0] and "available" in r["series"]:
        ax[0][j].step(t, r["series"]["available"], where="post", color="0.6", label="available")
      ax[0][j].step(t, r["series"]["used"], where="post", label=f"{s} used")
      starts = [x["start"] / 60 for x in r["steps"]]
      ax[1][j].plot(starts, [x["t_seed"] for x in r["steps"]], ".-", label=s)
      ax[2][j].plot(starts, [x["end"] - x["start"] for x in r["steps"]], ".-", label=s)
    c = _get(idx, preset, "colocated", seg)
    if c is not None:
      ax[2][j].plot([x["start"] / 60 for x in c["steps"]],
                    [x["end"] - x["start"] for x in c["steps"]], ".-", color="k",
                    label="veRL")
    ax[0][j].set_title(seg, fontsize=9)
    ax[2][j].set_xlabel("minutes")
  ax[0][0].set_ylabel("spot instances")
  ax[1][0].set_ylabel("T_seed (s)")
  ax[2][0].set_ylabel("step time (s)")
  for a in (ax[0][0], ax[1][0], ax[2][0]):
    a.legend(fontsize=7)
  fig.suptitle(f"{preset}: spot instances, T_seed and step time over the trace")
  fig.tight_layout()
  fig.savefig(path, dpi=90)

"""Spot-trace files: the formats users bring, parsed into a `traces.Trace`.

Known formats (`FORMATS`; `load_trace(path)` tells them apart, `load_trace(path, fmt)` forces
one; anything else is an error that lists these):

- `bamboo`: event log, CSV lines `<ms>,<add|remove>,<node>` (Bamboo NSDI'23; SpotServe's
  `trace_full/*.csv`). `end` = the last event's time.
- `parcae`: JSON lines `[ms, "add"|"remove"|"no-op", {"nodes": [...], "duration": ms}]`
  (Parcae NSDI'24 segments). `end` = the latest line time + its duration.
- `spotserve`: JSON lines `[ms, "add"|"remove", {"nodes": [...]}]` closed by
  `[ms, "DONE", {"nodes": []}]` (SpotServe ASPLOS'24 `trace_seg/*.txt`). `end` = the DONE time;
  a line after DONE is an error. (Parcae and SpotServe share one grammar: either accepts both.)
- `counts`: a count series, one `<timestamp>,<count>` per line (the form of availability logs:
  `date, time, available` also works). The timestamp is a number of seconds, an ISO date-time
  (`2021-12-11T10:00:00`, `2021-12-11 10:00`), or a date and a time in two fields; naive times
  are read as UTC. A first line whose count is not an integer is a header; `#` starts a
  comment; fields are split on commas (or on whitespace when a line has none).
  **Out-of-order and duplicate lines**: lines are applied in file order, and each line
  replaces every earlier point at or after its own time (a duplicate time: the later line
  wins; a line that goes back in time drops the points after it, then the series goes on).
  Time 0 is the earliest kept point; `end` = the last kept point + one tick (the median gap
  between kept points; 0 for a single point). The counts become add/remove events of slot
  nodes `slot-0, slot-1, ...`: slot i is live while the count is > i (a drop removes the
  highest slots).
- `skypilot`: SkyPilot's spot-traces JSON `{"metadata": {"gap_seconds": g}, "data": [n, ...]}`,
  one count per tick of g seconds; `end` = len(data) x g. Slots as for `counts`.

**Plausibility** (checked while reading, before any event is built, so that a wrong column or
unit fails at once instead of building a billion events): counts are whole numbers >= 0 (`nan`,
`1.5`, `-3` are errors naming the line), at most `MAX_LIVE` nodes are live at once, a trace has
at most `MAX_EVENTS` events, and times are finite. Every error is a `ValueError` that names the
file and line; a file that cannot be read is a `ValueError` too (`load_trace`).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
from collections.abc import Sequence

from jaxrl_sys.rollout.elastic.traces import ADD, REMOVE, Trace, TraceEvent, check_events

FORMATS = {
    "bamboo": "CSV event log '<ms>,<add|remove>,<node>' (Bamboo, SpotServe trace_full)",
    "parcae": "JSON lines '[ms, add|remove|no-op, {\"nodes\": [...], \"duration\": ms}]'",
    "spotserve": "JSON lines '[ms, add|remove, {\"nodes\": [...]}]' ending in a DONE line",
    "counts": "count series '<timestamp>,<count>' or '<date>,<time>,<count>' per line",
    "skypilot": "JSON '{\"metadata\": {\"gap_seconds\": g}, \"data\": [count, ...]}'",
}


# The traces shipped with the package (Bamboo, Parcae; `jaxrl_sys/data/traces/README.md` says
# where each comes from); the environment variable points elsewhere.
TRACES_ENV = "JAXRL_TRACES_DIR"


def traces_dir() -> str:
  """The directory of the shipped traces: `$JAXRL_TRACES_DIR` if set, else the package's own."""
  return os.environ.get(TRACES_ENV) or os.path.join(
      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data",
      "traces")


def bundled_trace(name: str) -> str:
  """The path of a shipped trace, e.g. `bundled_trace("bamboo/p3-trace.csv")`."""
  path = os.path.join(traces_dir(), name)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"trace {name!r} not found in {traces_dir()} (the package's traces, or "
                            f"${TRACES_ENV} when set)")
  return path


# Public spot traces make at most a few hundred instances available at once (Bamboo p3: 32;
# SkyPilot's 16-node zones: 16); a count beyond these is a unit or column mistake, and the
# events it would expand to (one per slot) would not fit in memory.
MAX_LIVE = 10_000
MAX_EVENTS = 2_000_000


def known_formats() -> str:
  return "; ".join(f"{k} ({v})" for k, v in FORMATS.items())


def _name(source: str) -> str:
  return os.path.splitext(os.path.basename(source))[0]


def _check_size(live: int, events: int, where: str) -> None:
  if live > MAX_LIVE:
    raise ValueError(f"{where}: {live:,} instances live at once; a trace may have at most "
                     f"{MAX_LIVE:,} (is the count column right?)")
  if events > MAX_EVENTS:
    raise ValueError(f"{where}: the trace expands to more than {MAX_EVENTS:,} add/remove "
                     "events; cut it into shorter pieces")


def _finish(rows: list[tuple[int, TraceEvent]], end: float, source: str) -> Trace:
  check_events([e for _, e in rows], lambda i: f"{source}:{rows[i][0]}")
  live = peak = 0
  for _, e in rows:
    live += 1 if e.kind == ADD else -1
    if live > peak:
      peak = live
  _check_size(peak, len(rows), source)
  return Trace(tuple(e for _, e in rows), end, _name(source))


def _lines(text: str):
  """(line number, stripped line) of the lines that are neither blank nor `#` comments."""
  for no, line in enumerate(text.splitlines(), 1):
    line = line.strip()
    if line and not line.startswith("#"):
      yield no, line


def parse_bamboo(text: str, source: str = "<string>") -> Trace:
  """Bamboo CSV text (`<ms>,<add|remove>,<node>` per line) -> Trace."""
  rows = []
  for no, line in _lines(text):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
      raise ValueError(f"{source}:{no}: expected '<ms>,<add|remove>,<node>', got {line!r}")
    try:
      ms = int(parts[0])
    except ValueError:
      raise ValueError(f"{source}:{no}: time {parts[0]!r} is not an integer (ms)") from None
    if len(rows) >= MAX_EVENTS:
      _check_size(0, len(rows) + 1, source)
    if ms < 0:
      raise ValueError(f"{source}:{no}: negative time {ms} ms")
    if parts[1] not in (ADD, REMOVE):
      raise ValueError(f"{source}:{no}: unknown action {parts[1]!r} (add or remove)")
    rows.append((no, TraceEvent(ms / 1000.0, parts[1], parts[2])))
  return _finish(rows, rows[-1][1].t if rows else 0.0, source)


def parse_parcae(text: str, source: str = "<string>") -> Trace:
  """Parcae / SpotServe JSON-lines text -> Trace (see the module docstring)."""
  rows, end, last, done = [], 0.0, 0.0, None
  for no, line in _lines(text):
    if done is not None:
      raise ValueError(f"{source}:{no}: a line after the DONE line {done}")
    try:
      ms, action, info = json.loads(line)
      nodes, duration = info.get("nodes", []), float(info.get("duration", 0))
      ms = float(ms)
      nodes = list(nodes)
    except (ValueError, TypeError, AttributeError) as err:
      raise ValueError(f"{source}:{no}: expected [ms, action, {{'nodes': [...]}}]: {err}") from None
    if not (math.isfinite(ms) and math.isfinite(duration) and duration >= 0):
      raise ValueError(f"{source}:{no}: time {ms} ms and duration {duration} ms must be finite "
                       "(duration >= 0)")
    if action not in (ADD, REMOVE, "no-op", "DONE"):
      raise ValueError(f"{source}:{no}: unknown action {action!r} (add, remove, no-op or DONE)")
    if ms < 0:
      raise ValueError(f"{source}:{no}: negative time {ms} ms")
    if action in ("no-op", "DONE") and nodes:
      raise ValueError(f"{source}:{no}: {action} line lists nodes {nodes}")
    if ms < last:
      raise ValueError(f"{source}:{no}: time goes backwards ({ms:g} ms after {last:g} ms)")
    last = ms
    if action == "DONE":
      done, end = no, ms / 1000.0
      continue
    _check_size(0, len(rows) + len(nodes), source)
    rows += [(no, TraceEvent(ms / 1000.0, action, str(n))) for n in nodes]
    end = max(end, (ms + duration) / 1000.0)
  return _finish(rows, end, source)


parse_spotserve = parse_parcae


def _timestamp(fields: Sequence[str], source: str, no: int) -> float:
  """Seconds of a timestamp given as one number, one ISO date-time or a date and a time."""
  if len(fields) == 1:
    try:
      t = float(fields[0])
    except ValueError:
      pass
    else:
      if not math.isfinite(t):
        raise ValueError(f"{source}:{no}: timestamp {fields[0]!r} is not a finite number")
      return t
  text = " ".join(fields)
  try:
    t = _dt.datetime.fromisoformat(text)
  except ValueError:
    raise ValueError(f"{source}:{no}: timestamp {text!r} is neither a number of seconds nor an "
                     "ISO date-time (e.g. 2021-12-11T10:00:00 or '2021-12-11, 10:00')") from None
  if t.tzinfo is None:
    t = t.replace(tzinfo=_dt.timezone.utc)
  return t.timestamp()


def _number(text: str) -> float | None:
  """The value of a numeric field (None: not a number at all, e.g. a header's column name)."""
  try:
    return float(text)
  except ValueError:
    return None


def _int_count(text: str) -> int | None:
  """The count in `text` when it is a whole number (None otherwise)."""
  try:
    return int(text)
  except ValueError:
    f = _number(text)
    return int(f) if f is not None and math.isfinite(f) and f.is_integer() else None


def _check_count(count: int, where: str) -> None:
  if count < 0:
    raise ValueError(f"{where}: negative count {count}")
  _check_size(count, 0, where)


def counts_to_trace(times: Sequence[float], counts: Sequence[int], end: float,
                    name: str = "") -> Trace:
  """A trace whose live count is `counts[i]` from `times[i]` (increasing, seconds) on: slot i
  (node `slot-i`) is live while the count is > i. Raises ValueError beyond `MAX_LIVE` nodes or
  `MAX_EVENTS` events (checked before any event is built)."""
  prev, changes = 0, 0
  for c in counts:
    _check_count(c, name or "counts")
    changes += abs(c - prev)
    prev = c
  _check_size(0, changes, name or "counts")
  ev, n = [], 0
  for t, c in zip(times, counts):
    if c > n:
      ev += [TraceEvent(float(t), ADD, f"slot-{i}") for i in range(n, c)]
    elif c < n:
      ev += [TraceEvent(float(t), REMOVE, f"slot-{i}") for i in range(n - 1, c - 1, -1)]
    n = c
  return Trace(tuple(ev), end, name)


def parse_counts(text: str, source: str = "<string>") -> Trace:
  """A count series -> Trace (format and out-of-order rule in the module docstring)."""
  points: list[tuple[float, int]] = []
  first = True
  for no, line in _lines(text):
    fields = [f.strip() for f in (line.split(",") if "," in line else line.split())]
    fields = [f for f in fields if f]
    numeric = len(fields) >= 2 and _number(fields[-1]) is not None
    if not numeric and first:  # a header
      first = False
      continue
    first = False
    count = _int_count(fields[-1]) if numeric else None
    if count is None:
      raise ValueError(f"{source}:{no}: expected '<timestamp>,<count>' with a whole-number count, "
                       f"got {line!r}")
    _check_count(count, f"{source}:{no}")
    t = _timestamp(fields[:-1], source, no)
    while points and points[-1][0] >= t:  # this line replaces the points at or after its time
      points.pop()
    points.append((t, count))
  if not points:
    raise ValueError(f"{source}: no '<timestamp>,<count>' line")
  t0 = points[0][0]
  times = [t - t0 for t, _ in points]
  gaps = [b - a for a, b in zip(times, times[1:])]
  tick = statistics.median(gaps) if gaps else 0.0
  return counts_to_trace(times, [c for _, c in points], times[-1] + tick, _name(source))


def parse_skypilot(text: str, source: str = "<string>") -> Trace:
  """SkyPilot spot-traces JSON -> Trace (see the module docstring)."""
  try:
    d = json.loads(text)
    gap = float(d["metadata"]["gap_seconds"])
    data = [_int_count(str(x)) for x in d["data"]]
  except (ValueError, TypeError, KeyError) as err:
    raise ValueError(f"{source}: expected {FORMATS['skypilot']}: {err!r}") from None
  if not (gap > 0 and math.isfinite(gap)):
    raise ValueError(f"{source}: gap_seconds must be a finite number > 0, got {gap}")
  for i, x in enumerate(data):
    if x is None:
      raise ValueError(f"{source}: data[{i}] = {d['data'][i]!r} is not a whole-number count")
    _check_count(x, f"{source}: data[{i}]")
  return counts_to_trace([i * gap for i in range(len(data))], data, len(data) * gap,
                         _name(source))


PARSERS = {"bamboo": parse_bamboo, "parcae": parse_parcae, "spotserve": parse_spotserve,
           "counts": parse_counts, "skypilot": parse_skypilot}


def detect_format(text: str, source: str = "<string>") -> str:
  """The format name of `text`, from its first line (see the module docstring)."""
  first = next(_lines(text), None)
  if first is None:
    raise ValueError(f"{source}: the trace is empty; known formats: {known_formats()}")
  no, line = first
  if line.startswith("{"):
    return "skypilot"
  if line.startswith("["):
    return "spotserve" if '"DONE"' in text else "parcae"
  fields = [f.strip() for f in (line.split(",") if "," in line else line.split())]
  if len(fields) == 3 and fields[1] in (ADD, REMOVE):
    return "bamboo"
  data = [ln for _, ln in _lines(text)][:2]
  for ln in data:
    f = [x.strip() for x in (ln.split(",") if "," in ln else ln.split()) if x.strip()]
    if len(f) >= 2 and _int_count(f[-1]) is not None:
      return "counts"
  raise ValueError(f"{source}:{no}: cannot tell the trace format from {line!r}; known formats: "
                   f"{known_formats()}")


def parse_trace(text: str, source: str = "<string>", fmt: str = "auto") -> Trace:
  """`text` in format `fmt` ("auto" = `detect_format`) -> Trace."""
  if fmt == "auto":
    fmt = detect_format(text, source)
  if fmt not in PARSERS:
    raise ValueError(f"unknown trace format {fmt!r}; known formats: auto, {known_formats()}")
  return PARSERS[fmt](text, source)


def load_trace(path: str, fmt: str = "auto") -> Trace:
  """The trace in file `path`, in format `fmt` ("auto": told from its first line)."""
  if fmt != "auto" and fmt not in PARSERS:
    raise ValueError(f"unknown trace format {fmt!r}; known formats: auto, {known_formats()}")
  if not os.path.isfile(path):
    raise ValueError(f"trace {path}: no such file" + (" (it is a directory)"
                                                      if os.path.isdir(path) else ""))
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as err:
    raise ValueError(f"trace {path}: cannot be read: {err}") from None
  return parse_trace(text, path, fmt)


def load_bamboo(path: str) -> Trace:
  """A Bamboo event log (e.g. `bundled_trace("bamboo/p3-trace.csv")`)."""
  return load_trace(path, "bamboo")


def load_parcae(path: str) -> Trace:
  """A Parcae segment (e.g. `bundled_trace("parcae/trace_hh_55_65.txt")`)."""
  return load_trace(path, "parcae")

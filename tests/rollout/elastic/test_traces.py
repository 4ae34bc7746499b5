"""Spot traces: the parsers reproduce every statistic of jaxrl_sys/data/traces/README.md; segment,
sample, scale and cap invariants; malformed input."""
import hashlib
import math
import pathlib

import numpy as np
import pytest

from jaxrl_sys.rollout.elastic.trace_formats import (load_bamboo, load_parcae, load_trace,
                                                     parse_bamboo, parse_parcae, traces_dir)
from jaxrl_sys.rollout.elastic.traces import Trace, TraceEvent, constant_trace

TRACES = pathlib.Path(traces_dir())
HOUR = 3600.0
PARCAE = {  # name: (max, min after start, nodes added, nodes removed) per the README
    "hh_55_65": (32, 20, 48, 19), "hl_15_25": (32, 23, 34, 11),
    "lh_80_90": (24, 11, 35, 18), "ll_10_11": (18, 14, 18, 4)}


@pytest.fixture(scope="module")
def p3():
  return load_bamboo(str(TRACES / "bamboo" / "p3-trace.csv"))


@pytest.fixture(scope="module")
def g4dn():
  return load_bamboo(str(TRACES / "bamboo" / "g4dn-trace.csv"))


def parcae(name):
  return load_parcae(str(TRACES / "parcae" / f"trace_{name}.txt"))


def test_files_are_the_documented_ones():
  for name, head, tail in [("p3", "0b7828fc", "6bdd68"), ("g4dn", "6a21d200", "3592eb")]:
    digest = hashlib.sha256((TRACES / "bamboo" / f"{name}-trace.csv").read_bytes()).hexdigest()
    assert digest.startswith(head) and digest.endswith(tail)


def test_p3_statistics(p3):
  c = p3.counts()
  assert (c.events, c.adds, c.removes, c.ids, c.timestamps) == (344, 177, 167, 177, 163)
  assert p3.last_time == p3.end == 40_920.0
  assert p3.max_live() == 32 and p3.live_at(p3.end) == 10
  assert round(p3.mean_live(), 1) == 24.0  # first event at 0: [0, last] = [first, last]
  _, hourly = p3.live_series(HOUR)
  assert hourly.tolist() == [18, 15, 30, 26, 23, 32, 21, 22, 18, 17, 18, 14]
  assert all(t % 60 == 0 for t in (e.t for e in p3.events))  # 1-minute resolution
  kinds = {}
  for e in p3.events:
    kinds.setdefault(e.t, set()).add(e.kind)
  assert all(len(k) == 1 for k in kinds.values())  # no timestamp has both an add and a remove


def test_g4dn_statistics_and_the_mean_convention(g4dn):
  c = g4dn.counts()
  assert (c.events, c.adds, c.removes, c.ids) == (153, 79, 74, 79)
  assert (g4dn.first_time, g4dn.last_time) == (480.0, 38_760.0)
  assert g4dn.max_live() == 24
  # The README's 12.8 is over [first event, last event]; over [0, last] it is 12.6.
  assert round(g4dn.mean_live(g4dn.first_time, g4dn.last_time), 1) == 12.8
  assert round(g4dn.mean_live(), 1) == 12.6


def test_crlf_and_lf_parse_alike(p3):
  raw = (TRACES / "bamboo" / "p3-trace.csv").read_bytes().decode()
  assert "\r\n" in raw
  assert parse_bamboo(raw.replace("\r\n", "\n")).events == p3.events


@pytest.mark.parametrize("name", sorted(PARCAE))
def test_parcae_segment_statistics(name):
  t = parcae(name)
  mx, mn, added, removed = PARCAE[name]
  _, live = t.live_series(60.0)
  assert t.end == HOUR and len(live) == 61
  assert (t.max_live(), int(live[1:].min())) == (mx, mn)
  assert (t.counts().adds, t.counts().removes) == (added, removed)
  assert load_trace(str(TRACES / "parcae" / f"trace_{name}.txt")).events == t.events


@pytest.mark.parametrize("name", sorted(PARCAE))
def test_parcae_segments_are_windows_of_p3(p3, name):
  """Tenths of an hour for three files; `ll_10_11` is hours 10-11, not 1.0-1.1."""
  a, b = (int(x) for x in name.split("_")[1:])
  scale = HOUR if name == "ll_10_11" else HOUR / 10
  seg, t = p3.segment(a * scale, b * scale), parcae(name)
  assert np.array_equal(seg.live_series(60.0)[1], t.live_series(60.0)[1])
  assert seg.counts() == t.counts()  # same numbers of adds / removes / timestamps; ids differ
  if name == "ll_10_11":
    tenths = p3.segment(a * HOUR / 10, b * HOUR / 10)
    assert tenths.live_at(0) != t.live_at(0)


def test_segment_invariants(p3):
  start, end = 2.5 * HOUR, 4.5 * HOUR
  seg = p3.segment(start, end)
  assert seg.end == end - start
  assert seg.live_nodes_at(0) == p3.live_nodes_at(start)
  for t in np.linspace(0, seg.end - 1, 37):
    assert seg.live_at(t) == p3.live_at(start + t)
  assert math.isclose(seg.live_integral(), p3.live_integral(start, end))
  assert all(0 <= e.t < seg.end for e in seg.events)


def test_sample_keeps_whole_histories_and_is_seeded(p3):
  half = p3.sample(0.5, seed=3)
  assert half.counts().ids == round(0.5 * 177)
  assert half.events == p3.sample(0.5, seed=3).events
  assert set(half.nodes) != set(p3.sample(0.5, seed=4).nodes)
  kept = set(half.nodes)
  assert half.events == tuple(e for e in p3.events if e.node in kept)
  assert p3.sample(1.0, 0).events == p3.events and p3.sample(0.0, 0).events == ()
  assert half.max_live() <= p3.max_live()


def test_scale_time_and_cap(p3):
  fast = p3.scale_time(0.01)
  assert fast.end == pytest.approx(p3.end * 0.01) and fast.counts() == p3.counts()
  assert fast.live_at(0.01 * 5 * HOUR) == p3.live_at(5 * HOUR)
  assert math.isclose(fast.mean_live(), p3.mean_live())
  capped = p3.cap(6)
  assert capped.max_live() == 6
  for t in np.linspace(0, p3.end, 101):
    assert capped.live_at(t) == min(6, p3.live_at(t))
    assert capped.live_nodes_at(t) <= p3.live_nodes_at(t)


def test_constant_trace():
  t = constant_trace(4, 100.0)
  assert t.live_at(0) == t.live_at(100) == t.max_live() == 4 and t.mean_live() == 4.0
  assert t.counts().removes == 0 and t.end == 100.0


def test_synthetic_statistics():
  t = parse_bamboo("0,add,a\n0,add,b\n60000,remove,a\n120000,add,a\n180000,remove,b\n")
  assert [t.live_at(x) for x in (0, 59, 60, 119, 120, 180)] == [2, 2, 1, 1, 2, 1]
  assert t.mean_live() == pytest.approx((2 * 60 + 1 * 60 + 2 * 60) / 180)
  assert t.counts().ids == 2 and t.counts().timestamps == 4
  times, live = t.live_series(60.0)
  assert times.tolist() == [0, 60, 120, 180] and live.tolist() == [2, 1, 2, 1]


@pytest.mark.parametrize("text, match", [
    ("0,add,a\n60000,remove,b\n", r"<string>:2: remove of node 'b', which is not live"),
    ("0,add,a\n0,add,a\n", r"<string>:2: add of node 'a', which is already live"),
    ("0,add,a\n0,evict,a\n", r"<string>:2: unknown action 'evict'"),
    ("60000,add,a\n0,add,b\n", r"<string>:2: time goes backwards"),
    ("0,add\n", r"<string>:1: expected"),
    ("x,add,a\n", r"<string>:1: time 'x' is not an integer"),
])
def test_bamboo_errors_name_the_line(text, match):
  with pytest.raises(ValueError, match=match):
    parse_bamboo(text)


@pytest.mark.parametrize("text, match", [
    ('[0, "add", {"nodes": ["a"]}]\n[60000, "remove", {"nodes": ["b"]}]', r"f.txt:2: remove"),
    ('[0, "boot", {"nodes": []}]', r"f.txt:1: unknown action 'boot'"),
    ('[60000, "no-op", {"nodes": []}]\n[0, "no-op", {"nodes": []}]', r"f.txt:2: time goes back"),
    ('[0, "add"]', r"f.txt:1: expected"),
    ("not json", r"f.txt:1: expected"),
])
def test_parcae_errors_name_the_line(text, match):
  with pytest.raises(ValueError, match=match):
    parse_parcae(text, "f.txt")


def test_file_errors_name_the_file(tmp_path):
  path = tmp_path / "bad.csv"
  path.write_text("0,add,a\r\n0,remove,z\r\n")
  with pytest.raises(ValueError, match=r"bad.csv:2: remove of node 'z'"):
    load_trace(str(path))


def test_trace_and_event_validation():
  with pytest.raises(ValueError, match="kind"):
    TraceEvent(0.0, "boot", "a")
  with pytest.raises(ValueError, match="before its last event"):
    Trace((TraceEvent(10.0, "add", "a"),), 5.0)
  with pytest.raises(ValueError, match="not live"):
    Trace((TraceEvent(1.0, "remove", "a"),), 5.0)
  t = constant_trace(2, 10.0)
  for bad in (lambda: t.segment(5, 5), lambda: t.sample(1.5), lambda: t.scale_time(0),
              lambda: t.cap(-1), lambda: t.live_series(0)):
    with pytest.raises(ValueError):
      bad()

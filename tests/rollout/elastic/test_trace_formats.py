"""Trace files users bring: each format loads to the availability curve written by hand below;
the out-of-order rule of count series; unknown formats name the known ones."""
import json

import pytest

from jaxrl_sys.rollout.elastic.trace_formats import (FORMATS, detect_format, load_trace,
                                                     parse_counts, parse_trace)


def _curve(trace, times):
  return [trace.live_at(t) for t in times]


def test_count_series_with_dates_a_header_and_out_of_order_lines(tmp_path):
  # A GCP/AWS-style availability log. Line 5 goes back to 10:02 (file order wins: the points at
  # or after 10:02 - 10:02 and 10:03 - are replaced), 10:04 appears twice (the later wins).
  path = tmp_path / "avail.csv"
  path.write_text("date, time, available\n"
                  "2021-12-11, 10:00:00, 3\n"
                  "2021-12-11, 10:01:00, 5\n"
                  "2021-12-11, 10:02:00, 4\n"
                  "2021-12-11, 10:03:00, 1\n"
                  "2021-12-11, 10:02:00, 2\n"
                  "2021-12-11, 10:04:00, 6\n"
                  "2021-12-11, 10:04:00, 0\n"
                  "2021-12-11, 10:05:00, 2\n")
  t = load_trace(str(path))
  assert detect_format(path.read_text()) == "counts"
  # expected curve, by hand: 0-60 s: 3, 60-120: 5, 120-240: 2, 240-300: 0, 300-: 2
  assert _curve(t, [0, 59, 60, 119, 120, 180, 239, 240, 299, 300, 359]) == \
      [3, 3, 5, 5, 2, 2, 2, 0, 0, 2, 2]
  assert t.end == 360.0  # the last point + one tick (60 s)
  assert t.max_live() == 5 and t.name == "avail"


@pytest.mark.parametrize("text, curve", [
    ("0,2\n30,3\n60,1\n", [2, 3, 1]),                     # seconds
    ("t,n\n0,2\n30,3\n60,1\n", [2, 3, 1]),                # a header
    ("0 2\n30 3\n60 1\n", [2, 3, 1]),                      # whitespace
    ("2024-01-01T00:00:00,2\n2024-01-01T00:00:30,3\n2024-01-01T00:01:00,1\n", [2, 3, 1]),
    ("0,2\n60,9\n30,3\n60,1\n", [2, 3, 1]),               # back to 30 drops the 60 s point
    ("0,2\n30,7\n30,3\n60,1\n", [2, 3, 1]),               # duplicate: the later line wins
])
def test_count_series_forms(text, curve):
  t = parse_counts(text)
  assert _curve(t, [0, 30, 60]) == curve and t.end == 90.0


def test_spotserve_events_with_done(tmp_path):
  path = tmp_path / "trace_0304.txt"
  lines = [[0, "add", {"nodes": ["node-0", "node-1", "node-2"]}],
           [120000, "add", {"nodes": ["node-3"]}],
           [600000, "remove", {"nodes": ["node-0", "node-3"]}],
           [1320000, "DONE", {"nodes": []}]]
  path.write_text("".join(json.dumps(x) + "\n" for x in lines))
  t = load_trace(str(path))
  assert detect_format(path.read_text()) == "spotserve"
  assert _curve(t, [0, 119, 120, 599, 600, 1319]) == [3, 3, 4, 4, 2, 2]
  assert t.end == 1320.0  # the DONE line closes the trace
  with pytest.raises(ValueError, match=r"x.txt:2: a line after the DONE line 1"):
    parse_trace('[0, "DONE", {"nodes": []}]\n[60000, "add", {"nodes": ["a"]}]\n', "x.txt")


def test_parcae_and_bamboo_and_skypilot_curves():
  parcae = ('[0, "add", {"nodes": ["a", "b"], "duration": 60000}]\n'
            '[60000, "remove", {"nodes": ["a"], "duration": 60000}]\n'
            '[120000, "no-op", {"nodes": [], "duration": 60000}]\n')
  t = parse_trace(parcae)
  assert detect_format(parcae) == "parcae"
  assert _curve(t, [0, 60, 120]) == [2, 1, 1] and t.end == 180.0
  bamboo = "0,add,a\r\n0,add,b\r\n60000,remove,a\r\n120000,add,c\r\n"
  t = parse_trace(bamboo)
  assert detect_format(bamboo) == "bamboo"
  assert _curve(t, [0, 60, 120]) == [2, 1, 2] and t.end == 120.0
  sky = json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 16, 16, 4]})
  t = parse_trace(sky)
  assert detect_format(sky) == "skypilot"
  assert _curve(t, [0, 300, 600, 900]) == [0, 16, 16, 4] and t.end == 1200.0


def test_unknown_formats_name_the_known_ones(tmp_path):
  path = tmp_path / "weird.log"
  path.write_text("instance i-123 launched\n")
  with pytest.raises(ValueError, match=r"weird.log:1: cannot tell the trace format") as err:
    load_trace(str(path))
  assert all(name in str(err.value) for name in FORMATS)
  with pytest.raises(ValueError, match=r"unknown trace format 'csv'; known formats: auto, bamboo"):
    load_trace(str(path), "csv")
  with pytest.raises(ValueError, match=r"f.csv:2: negative count -1"):
    parse_counts("0,1\n60,-1\n", "f.csv")
  with pytest.raises(ValueError, match=r"f.csv:2: timestamp 'yesterday' is neither"):
    parse_counts("0,1\nyesterday,2\n", "f.csv")


@pytest.mark.parametrize("text, match", [
    ("0,1\n60,1e9\n", r"f.csv:2: 1,000,000,000 instances live at once; a trace may have at most"),
    ("0,1\n60,20001\n", r"f.csv:2: 20,001 instances live at once"),
    ("0,1\n60,1.5\n", r"f.csv:2: expected '<timestamp>,<count>' with a whole-number count"),
    ("0,nan\n60,2\n", r"f.csv:1: expected '<timestamp>,<count>' with a whole-number count"),
    ("0,2\n60,inf\n", r"f.csv:2: expected '<timestamp>,<count>' with a whole-number count"),
    ("0,1\ninf,2\n", r"f.csv:2: timestamp 'inf' is not a finite number"),
    ("0,-3\n", r"f.csv:1: negative count -3"),
    # 300 swings between 0 and 10,000 slots: 3 million add/remove events, refused up front
    ("".join(f"{60 * i},{10_000 * (i % 2)}\n" for i in range(300)), r"more than 2,000,000"),
])
def test_implausible_counts_fail_at_once_naming_the_line(text, match):
  # A count of 1e9 instances used to build a billion events (a hang in `spot_sim --trace` and
  # `grpo --preempt_trace`): it is refused while the file is read, before any event exists.
  with pytest.raises(ValueError, match=match):
    parse_counts(text, "f.csv")


def test_implausible_json_traces_fail_naming_the_field():
  big = json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 16, 1e9]})
  with pytest.raises(ValueError, match=r"s.json: data\[2\]: 1,000,000,000 instances live"):
    parse_trace(big, "s.json")
  with pytest.raises(ValueError, match=r"s.json: data\[1\] = 2.5 is not a whole-number count"):
    parse_trace(json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 2.5]}), "s.json")
  with pytest.raises(ValueError, match=r"gap_seconds must be a finite number > 0, got -60"):
    parse_trace(json.dumps({"metadata": {"gap_seconds": -60}, "data": [1]}), "s.json")
  nodes = json.dumps([0, "add", {"nodes": [f"n{i}" for i in range(10_001)]}])
  with pytest.raises(ValueError, match=r"p.txt: 10,001 instances live at once"):
    parse_trace(nodes + "\n", "p.txt")
  with pytest.raises(ValueError, match=r"p.txt:1: time inf ms and duration"):
    parse_trace('[Infinity, "add", {"nodes": ["a"]}]\n', "p.txt")


def test_files_that_cannot_be_read_are_value_errors_naming_them(tmp_path):
  with pytest.raises(ValueError, match=r"trace .*nope.csv: no such file"):
    load_trace(str(tmp_path / "nope.csv"))
  with pytest.raises(ValueError, match=r"no such file \(it is a directory\)"):
    load_trace(str(tmp_path))
  binary = tmp_path / "blob.csv"
  binary.write_bytes(b"\xff\xfe\x00\x81")
  with pytest.raises(ValueError, match=r"blob.csv: cannot be read"):
    load_trace(str(binary))
  bom = tmp_path / "bom.csv"  # a UTF-8 byte-order mark, as Windows tools write
  bom.write_bytes("\ufefftimestamp,count\n0,2\n60,3\n".encode())
  assert _curve(load_trace(str(bom)), [0, 60]) == [2, 3]

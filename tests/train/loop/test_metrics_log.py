"""MetricsLogger after a resume: each replayed step keeps one record, in metrics.jsonl and in
TensorBoard (read back from the event files with TensorBoard's purge rule)."""
import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from jaxrl_sys.train.loop.metrics_log import MetricsLogger
from tests.docs.commands import REPO

# The event files are read back with tensorboardX's protos (a GPU image may lack tensorboardX).
_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2",
                           reason="tensorboardX is not installed (pip install tensorboardX)")
Event, SessionLog = _pb2.Event, _pb2.SessionLog


def _records(path):
  """The TFRecord payloads of one event file (length, length crc, data, data crc)."""
  with open(path, "rb") as f:
    data = f.read()
  out, i = [], 0
  while i < len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    out.append(data[i + 12:i + 12 + n])
    i += 12 + n + 4
  return out


def _scalars_as_tensorboard_shows(tb_dir):
  """{tag: [(step, value)]} after TensorBoard's purge rule: files in name order; a SessionLog
  START at step N discards the events read so far at steps >= N."""
  seen, purges = {}, []
  for path in sorted(glob.glob(os.path.join(tb_dir, "*tfevents*"))):
    for raw in _records(path):
      ev = Event.FromString(raw)
      if ev.HasField("session_log") and ev.session_log.status == SessionLog.START:
        purges.append(ev.step)
        seen = {t: [(s, v) for s, v in pts if s < ev.step] for t, pts in seen.items()}
      for val in ev.summary.value:
        seen.setdefault(val.tag, []).append((ev.step, val.simple_value))
  return seen, purges


def test_resume_purges_replayed_steps_in_tensorboard_and_jsonl(tmp_path):
  first = MetricsLogger(str(tmp_path))
  first.keep_until(0)
  for step in range(1, 6):  # killed after step 5; its newest checkpoint is step 2
    first.log(step, {"reward_mean": float(step)})
  first.close()
  second = MetricsLogger(str(tmp_path))
  assert second.keep_until(2) == 3
  for step in range(3, 7):
    second.log(step, {"reward_mean": 10.0 * step})
  second.close()
  scalars, purges = _scalars_as_tensorboard_shows(tmp_path / "tb")
  assert purges == [3]  # only the resumed writer marks a purge (a fresh run has nothing to purge)
  assert scalars["reward_mean"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0),
                                    (6, 60.0)]
  rows = [json.loads(s) for s in open(tmp_path / "metrics.jsonl")]
  assert [(r["step"], r["reward_mean"]) for r in rows] == scalars["reward_mean"]


def test_tensorboard_writer_loads_without_importing_torch(tmp_path):
  # A fresh interpreter (torch is installed beside the suite): logging scalars must not pull in
  # torch, and torch must still import afterwards.
  code = ("import sys\n"
          "from jaxrl_sys.train.loop.metrics_log import MetricsLogger\n"
          f"m = MetricsLogger({str(tmp_path)!r})\n"
          "m.log(1, {'loss': 0.5})\n"
          "m.close()\n"
          "assert 'torch' not in sys.modules, 'tensorboardX imported torch'\n"
          "import torch\n"
          "print('ok', torch.__name__)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=120, check=False)
  assert out.returncode == 0 and "ok torch" in out.stdout, out.stderr[-2000:]
  seen, _ = _scalars_as_tensorboard_shows(os.path.join(tmp_path, "tb"))
  assert seen["loss"] == [(1, 0.5)]

"""Where rollout runs: the in-process engine count, the clients the factory builds by name, and
a bad spot trace refused before any worker starts."""
import os

import pytest

from jaxrl_sys.rollout import InProcessWorker, ThreadWorker
from jaxrl_sys.rollout.setup.factory import CLIENTS, client_kind, make_client
from jaxrl_sys.rollout.setup.local import local_worker_count
from jaxrl_sys.rollout.setup.spec import ClientOptions, RolloutSetup
from tests.precision_helpers import per_backend
from tests.rollout.common import CFG, engine_config


def test_local_worker_count_auto_and_explicit():
  # a CPU host of 2+ cores: two engines of 32 slots; an accelerator: one engine
  assert local_worker_count(0, 64) == per_backend(cpu=2 if (os.cpu_count() or 1) >= 2 else 1,
                                                  gpu=1)
  assert local_worker_count(0, 63) == 1          # fewer than 32 slots each: one engine
  assert local_worker_count(3, 64) == 3
  assert local_worker_count(8, 4) == 4   # at most one per slot


def test_the_factory_builds_each_kind_by_name_and_splits_the_slots_over_threads():
  setup, ec = RolloutSetup(), engine_config(num_slots=4, decode_row_buckets=(2, 4))
  assert client_kind(setup, 1) == "local" and client_kind(setup, 2) == "thread"
  assert client_kind(RolloutSetup(rollout="ray"), 1) == "ray"
  assert sorted(CLIENTS) == ["local", "ray", "thread"]
  one = make_client(setup, CFG, ec, options=ClientOptions(local_workers=1))
  two = make_client(setup, CFG, ec, options=ClientOptions(local_workers=2))
  try:
    [w1] = list(one.handles.values())
    ws2 = list(two.handles.values())
    assert isinstance(w1, InProcessWorker) and all(isinstance(w, ThreadWorker) for w in ws2)
    assert [w.server.engine_config.num_slots for w in ws2] == [2, 2]
    assert w1.server.engine_config.num_slots == 4
    assert one.fleet.latest == -1 and two.fleet.latest == -1  # no weights: the caller publishes
  finally:
    one.close()
    two.close()
  with pytest.raises(ValueError, match="unknown rollout client 'vllm'"):
    make_client(setup, CFG, ec, kind="vllm")


def test_a_trace_that_never_makes_an_instance_available_is_refused(tmp_path):
  empty = tmp_path / "zero.csv"
  empty.write_text("0,0\n60,0\n")
  with pytest.raises(ValueError, match="never makes an instance available"):
    RolloutSetup(rollout="ray", preempt_trace=str(empty))
  ok = tmp_path / "counts.csv"
  ok.write_text("date, time, available\n2021-12-11, 10:00, 2\n2021-12-11, 10:01, 1\n")
  assert RolloutSetup(rollout="ray", preempt_trace=str(ok)).preempt_trace == str(ok)
  huge = tmp_path / "huge.csv"  # a count of 1e9 instances built a billion events (a hang)
  huge.write_text("0,1\n60,1e9\n")
  with pytest.raises(ValueError, match=r"rollout.preempt_trace: .*huge.csv:2: 1,000,000,000 "
                                       r"instances"):
    RolloutSetup(rollout="ray", preempt_trace=str(huge))
  with pytest.raises(ValueError, match="rollout.trace_time_scale must be a finite number > 0"):
    RolloutSetup(rollout="ray", preempt_trace=str(ok), trace_time_scale=float("nan"))


@pytest.mark.parametrize("field,bad,rule", [
    ("worker_token_delay", -0.5, ">= 0"), ("worker_token_delay", float("nan"), ">= 0"),
    ("chaos_kill_every", -3.0, ">= 0"), ("chaos_kill_every", float("inf"), ">= 0"),
    ("chaos_restart_after", float("nan"), ">= 0"), ("worker_cpus", -1.0, ">= 0"),
    ("worker_gpus", float("inf"), ">= 0"), ("heartbeat_timeout", 0.0, "> 0"),
    ("startup_timeout", float("nan"), "> 0"), ("startup_timeout", -1.0, "> 0")])
def test_rollout_numbers_are_refused_at_the_edge(field, bad, rule):
  """Issue 44: a negative or NaN delay or timeout was accepted and failed minutes into a Ray
  run (a negative --worker_token_delay 25 s in, advising a larger failure budget)."""
  with pytest.raises(ValueError, match=rf"rollout.{field}={bad} must be a finite number {rule}"):
    RolloutSetup(rollout="ray", **{field: bad})
  RolloutSetup(rollout="ray", **{field: 1.0})  # a sane value of the same field passes


def test_a_bad_weight_store_is_refused_before_ray_starts():
  """Issue 44: `--weight_store=tensorstore:` (no path) was refused only after Ray had started
  and the workers were launched."""
  for spec in ("tensorstore", "tensorstore:", "ray:x", "s3:bucket"):
    with pytest.raises(ValueError, match=r"rollout.weight_store: unknown weight store .*use "
                                         r"'memory', 'ray' or 'tensorstore:PATH_OR_URL'"):
      RolloutSetup(rollout="ray", weight_store=spec)
  assert RolloutSetup(rollout="ray", weight_store="tensorstore:/w").weight_store == (
      "tensorstore:/w")
  with pytest.raises(ValueError, match=r"rollout.theta=-1 must be >= 0"):
    RolloutSetup(theta=-1)

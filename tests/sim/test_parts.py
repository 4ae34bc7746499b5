"""The simulator's parts: the engine's closed-form event jumps, KV retraction, the fluid model of
shared sender NICs, the worker protocol (a preemption keeps the streamed tokens), settings."""
import dataclasses

import numpy as np
import pytest

from jaxrl_sys.rollout import ManualClock
from jaxrl_sys.rollout.types import FinishReason, Request
from jaxrl_sys.rollout.workers.protocol import Commands, WorkerLost
from jaxrl_sys.sim import QWEN3_8B, QWEN3_14B, DecodeCurve, transfer_time
from jaxrl_sys.sim.cluster import SimCluster
from jaxrl_sys.sim.engine import EngineModel, Seq, SimEngine
from jaxrl_sys.sim.hardware import GCP_A3
from jaxrl_sys.sim.senders import SenderPool
from jaxrl_sys.sim.settings import SETTINGS, config_for, get_settings, scale_reserved
from jaxrl_sys.sim.store import SimWeightStore
from jaxrl_sys.sim.timing import prefill_time
from tests.sim.common import small

UNBOUNDED = dataclasses.replace(QWEN3_8B, decode=dataclasses.replace(QWEN3_8B.decode,
                                                                    kv_capacity_tokens=0))


@pytest.mark.parametrize("host_s", [0.0, 0.0085, 1.0])
def test_engine_event_jumps_equal_step_by_step_decoding(host_s):
  # Attention at 10 us per context token: the GPU step starts at 8.1 ms and grows by 0.06 ms a
  # step with six sequences. host_s: none; 8.5 ms, which the GPU overtakes after 8 steps and
  # again each time fewer sequences run; one above every GPU step (all host-bound).
  preset = dataclasses.replace(UNBOUNDED, decode=dataclasses.replace(
      UNBOUNDED.decode, per_ctx_token_s=1e-5, host_s=host_s))
  targets, prompt = [5, 17, 17, 40, 123, 301], 50
  eng = SimEngine(preset, EngineModel())
  for i, n in enumerate(targets):
    eng.add(Seq(i, i, prompt, 0, n, 1000, 0.0))
  for t in (0.05, 0.3, 0.31, 1e9):  # advancing in pieces changes nothing
    eng.advance(t)
  got = {s.rid: t for s, t in eng.take_finished()}
  # Reference: one prefill of the distinct prompts, then one decode step at a time, each the
  # longer of the host's and the GPU's work.
  d, t = preset.decode, prefill_time(preset, prompt * len(targets), prompt)
  live, done, step = dict(enumerate(targets)), {}, 0
  while live:
    ctx = sum(prompt + step for _ in live)
    t += max(host_s, d.fixed_s + d.per_seq_s * len(live) + d.per_ctx_token_s * ctx)
    step += 1
    for rid in [r for r, n in live.items() if n == step]:
      done[rid] = t
      del live[rid]
  assert got.keys() == done.keys()
  for rid, when in done.items():
    assert got[rid] == pytest.approx(when, rel=1e-12)
  assert eng.decoded == sum(targets)


def test_engine_overflow_retracts_and_every_request_still_gets_its_tokens():
  small_kv = dataclasses.replace(QWEN3_8B, decode=dataclasses.replace(QWEN3_8B.decode,
                                                                     kv_capacity_tokens=20_000))
  eng = SimEngine(small_kv, EngineModel(reserve_init=0.0, reserve_min=0.0))
  rng = np.random.default_rng(0)
  targets = rng.integers(500, 3000, size=40)
  for i, n in enumerate(targets):
    eng.add(Seq(i, i // 4, 100, 0, int(n), 4000, 0.0))
  for t in np.linspace(1, 2000, 200):  # advancing in pieces changes nothing
    eng.advance(float(t))
    assert eng.used() <= small_kv.decode.kv_capacity_tokens
  fin = eng.take_finished()
  assert eng.retracted > 0 and len(fin) == 40 and not eng.running and not eng.waiting
  assert all(s.gen0 == s.target for s, _ in fin)
  assert eng.decoded == int(targets.sum())


def test_sglang_reservation_admits_fewer_requests_at_first():
  eng = SimEngine(QWEN3_14B, EngineModel())
  for i in range(600):
    eng.add(Seq(i, i // 8, 256, 0, 10_000, 14_336, 0.0))
  eng.advance(0.0)
  cap = QWEN3_14B.decode.kv_capacity_tokens
  assert len(eng.running) == int(cap // (256 + 0.7 * 4096))  # context + reservation each
  eng.advance(60.0)  # the ratio decays: more fit
  assert len(eng.running) > 300


def test_shared_sender_nic_fluid_model():
  fluid = dataclasses.replace(GCP_A3, sender_streams=None)  # every pull at once, NIC shared
  nbytes, pool = 16.4e9, SenderPool(1, fluid)
  for i in range(8):
    pool.start(f"w{i}", 0, nbytes, 0.0)
  pool.advance(100.0)
  assert pool.done_at("w0") == pytest.approx(transfer_time(nbytes, 50, 8, 200), rel=1e-9)
  # Staggered: four alone at 50 Gbps each; four more join after 1 s and all get 25 Gbps.
  pool, bits = SenderPool(1, fluid), 8 * nbytes
  for i in range(4):
    pool.start(f"a{i}", 0, nbytes, 0.0)
  for i in range(4):
    pool.start(f"b{i}", 0, nbytes, 1.0)
  pool.advance(100.0)
  t_a = 1.0 + (bits - 50e9) / 25e9
  assert pool.done_at("a0") == pytest.approx(t_a, rel=1e-9)
  moved_b = 25e9 * (t_a - 1.0)
  assert pool.done_at("b3") == pytest.approx(t_a + (bits - moved_b) / 50e9, rel=1e-9)


def test_a_sender_serves_four_pulls_at_once_and_queues_the_rest():
  # RLBoost's release: four transfer groups per sender. Sixty Qwen3-14B instances pulling from
  # one 200 Gbps node: four at a time at their 50 Gbps line rate, in arrival order, so the k-th
  # (0-based) finishes at (k // 4 + 1) x 4.72 s; the last at 70.8 s, as if all shared the NIC.
  nbytes = 29.5e9
  pool = SenderPool(1, GCP_A3)
  for i in range(60):
    pool.start(f"w{i}", 0, nbytes, 0.0)
  assert pool.queued() == 56
  one = 8 * nbytes / 50e9
  assert pool.eta("w4") == pytest.approx(one)  # queued: no earlier than the first finish
  pool.advance(1000.0)
  for k in (0, 3, 4, 7, 59):
    assert pool.done_at(f"w{k}") == pytest.approx((k // 4 + 1) * one, rel=1e-9), k
  assert pool.queued() == 0
  # a late pull waits behind the earlier ones of its sender only; another sender is free
  pool = SenderPool(2, GCP_A3)
  for i in range(5):
    pool.start(f"a{i}", 0, nbytes, 0.0)
  pool.start("b", 1, nbytes, 1.0)
  pool.advance(100.0)
  assert pool.done_at("a4") == pytest.approx(2 * one) and pool.done_at("b") == \
      pytest.approx(1.0 + one)
  # a cancelled pull frees its stream at once
  pool = SenderPool(1, GCP_A3)
  for i in range(5):
    pool.start(f"c{i}", 0, nbytes, 0.0)
  pool.cancel("c0", 1.0)
  pool.advance(100.0)
  assert pool.done_at("c4") == pytest.approx(1.0 + one)


def _ref():
  store = SimWeightStore(QWEN3_8B.weight_bytes)
  store.publish(None, 0)
  return store.published()


def test_a_preempted_worker_reports_the_streamed_tokens_then_is_lost():
  clock = ManualClock()
  cluster = SimCluster(clock, QWEN3_8B, EngineModel())
  w = cluster.make_local("w")
  w.send(Commands(load=_ref()))
  reqs = [Request(i, np.zeros(64, np.int32), 5000, np.zeros(2, np.uint32), group_id=i,
                  meta={"target": 4000}) for i in range(3)]
  clock.advance(0.2)
  assert w.receive().version == 0
  w.send(Commands(submit=reqs))
  clock.advance(7.0)
  w.preempt()
  rep = w.receive()
  assert rep.fatal and len(rep.chunks) == 3
  for c in rep.chunks:
    assert c.finish is None and c.start == 0 and len(c.tokens) % 10 == 0 and len(c.tokens) > 100
  with pytest.raises(WorkerLost):
    w.receive()
  assert w.ended == pytest.approx(7.2) and cluster.dying == set()


def test_finished_requests_carry_all_their_tokens_and_the_finish_reason():
  clock = ManualClock()
  cluster = SimCluster(clock, QWEN3_8B, EngineModel())
  w = cluster.make_local("w")
  w.send(Commands(load=_ref()))
  clock.advance(0.2)
  w.receive()
  w.send(Commands(submit=[Request(0, np.zeros(8, np.int32), 30, np.zeros(2, np.uint32),
                                  meta={"target": 30}),
                          Request(1, np.zeros(8, np.int32), 30, np.zeros(2, np.uint32),
                                  meta={"target": 12})]))
  clock.advance(5.0)
  rep = w.receive()
  fin = {c.request_id: c for c in rep.chunks}
  assert fin[0].finish == FinishReason.LENGTH and len(fin[0].tokens) == 30
  assert fin[1].finish == FinishReason.STOP and len(fin[1].tokens) == 12


def test_settings_apply_their_switches():
  names = [s.name for s in get_settings("rlboost,restart")]
  assert names == ["colocated", "rlboost", "restart"]
  with pytest.raises(ValueError):
    get_settings("nope")
  base = small()
  assert config_for(SETTINGS["restart"], base).manager.migrate_tokens is False
  no_seed = config_for(SETTINGS["no_seeding"], base).offload
  assert no_seed.t_init == no_seed.t_min == 0.0 and no_seed.rate < 1e-6 and no_seed.cap_workers
  assert config_for(SETTINGS["sync_push"], base).sync_push
  rel = config_for(SETTINGS["release"], base)
  assert rel.manager.trim_siblings and not rel.manager.balance and not rel.offload.cap_workers
  two = config_for(SETTINGS["colocated_2x"], base)
  assert two.preset.train_nodes == 2 and two.local_engines == 8
  assert two.preset.train_s_per_token == pytest.approx(base.preset.train_s_per_token * 0.35 / 0.3)
  assert scale_reserved(base.preset, 1) is base.preset
  assert config_for(SETTINGS["disagg"], base, 5).local_engines == 0


def test_decode_curve_is_the_presets():
  assert isinstance(QWEN3_8B.decode, DecodeCurve)

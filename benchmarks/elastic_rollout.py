"""Parts (b) and (c) of `benchmarks/elastic.py`: preemption overhead and rollout throughput on
real Ray workers of this machine.

(b) One preemption (SIGKILL of one of 2 Ray workers) at 25 / 50 / 75% of the undisturbed
    generation phase: the phase's extra time with token migration (every token kept) vs
    restart-from-prompt (`ManagerConfig(migrate_tokens=False)`). RLBoost reports 33-76% less
    overhead for migration. Each trial starts fresh actors (compiled before the clock starts).
    On a 2-core machine the two workers share the cores, so a kill also frees CPU for the
    survivor: early kills can even shorten the phase; `saved_s` (restart minus migration time)
    is the robust figure.
(c) Rollout throughput (generated tokens / s) of one batch with 0 Ray workers (the in-process
    engine only), then 1, 2, 3 Ray workers and no in-process engine.
"""
from __future__ import annotations

import os
import signal
import statistics
import time

import numpy as np

from jaxrl_sys.models import ModelConfig, SamplingConfig, init_params
from jaxrl_sys.rollout import (EngineConfig, InProcessWorker, ManagerConfig, Request,
                               RolloutManager, request_key)

MODEL = ModelConfig(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                    head_dim=32, intermediate_size=384, max_seq_len=256)


def engine_config(slots: int) -> EngineConfig:
  return EngineConfig(num_slots=slots, max_len=160, prefill_buckets=(32, 64, 128, 160),
                      prefill_batch_buckets=(1, 4, 16), stream_every=4,
                      sampling=SamplingConfig(temperature=1.0))


def requests(n: int, max_new: int, seed: int = 0) -> list[Request]:
  rng = np.random.default_rng(seed)
  return [Request(i, rng.integers(1, MODEL.vocab_size, size=16), max_new, request_key(seed, i),
                  group_id=i // 4) for i in range(n)]


def _params():
  import jax  # pylint: disable=import-outside-toplevel
  return jax.device_get(init_params(MODEL, jax.random.PRNGKey(0)))


def _ray_workers(n: int, slots: int, prefix: str):
  from jaxrl_sys.rollout.workers.ray import RayWorker  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  cache = jax.config.jax_compilation_cache_dir
  return [RayWorker(f"{prefix}{i}", MODEL, engine_config(slots), warmup=True, compile_cache=cache)
          for i in range(n)]


def _manager(workers, params, version, **cfg):
  from jaxrl_sys.rollout.weights.ray import RayWeightStore  # pylint: disable=import-outside-toplevel
  store = RayWeightStore() if any(not w.synchronous for w in workers) else None
  m = RolloutManager(workers, store=store, config=ManagerConfig(balance=False, **cfg))
  m.publish(params, version)
  while any(ws.version < version for ws in m.fleet.values()):  # load + warm up, untimed
    m.round()
    time.sleep(0.01)
  return m


def _run(m, reqs, kill_at: float | None = None, victim=None) -> tuple[float, int]:
  t0 = time.monotonic()
  m.submit(reqs)
  out, killed = [], False
  while m.num_pending():
    out += m.poll(min_count=1, timeout=0.05)
    if kill_at is not None and not killed and time.monotonic() - t0 >= kill_at:
      os.kill(victim.pid(), signal.SIGKILL)
      killed = True
  return time.monotonic() - t0, sum(len(c.request.tokens) for c in out)


def part_b(args) -> dict:
  from jaxrl_sys.rollout.workers.ray import init_ray  # pylint: disable=import-outside-toplevel
  init_ray()
  params, version, rows = _params(), [0], []
  reqs = lambda: requests(args.b_requests, args.b_max_new)  # noqa: E731

  def trial(kill_frac, migrate, base):
    version[0] += 1
    ws = _ray_workers(2, args.b_requests, f"b{version[0]}-")
    m = _manager(ws, params, version[0], migrate_tokens=migrate)
    secs, _ = _run(m, reqs(), None if kill_frac is None else kill_frac * base, ws[0])
    stats = m.fleet.stats
    kept, lost = stats.tokens_kept, stats.tokens_discarded
    m.close()
    return secs, kept, lost

  base = statistics.median(trial(None, True, 0)[0] for _ in range(args.repeats))
  out = {"undisturbed_s": base, "rows": rows}
  for frac in (0.25, 0.5, 0.75):
    mig = [trial(frac, True, base) for _ in range(args.repeats)]
    res = [trial(frac, False, base) for _ in range(args.repeats)]
    m_s, r_s = statistics.median(x[0] for x in mig), statistics.median(x[0] for x in res)
    rows.append({"preempt_at": f"{int(frac * 100)}%", "migrate_s": m_s, "restart_s": r_s,
                 "migrate_overhead_s": m_s - base, "restart_overhead_s": r_s - base,
                 "saved_s": r_s - m_s,
                 # meaningless when a kill frees more CPU than it costs (2 shared cores)
                 "overhead_cut": 1 - (m_s - base) / (r_s - base) if r_s - base > 0.05 else
                 float("nan"),
                 "tokens_kept": statistics.median(x[1] for x in mig),
                 "tokens_redone_restart": statistics.median(x[2] for x in res)})
  return out


def part_c(args) -> dict:
  from jaxrl_sys.rollout.workers.ray import init_ray  # pylint: disable=import-outside-toplevel
  init_ray()
  params, rows = _params(), []
  reqs = requests(args.c_requests, args.c_max_new, seed=1)
  for n in range(4):
    if n == 0:
      ws = [InProcessWorker("local", MODEL, engine_config(args.c_requests), warmup=True)]
    else:
      ws = _ray_workers(n, args.c_requests, f"c{n}-")
    m = _manager(ws, params, n + 1)
    times = []
    for k in range(args.repeats):
      secs, toks = _run(m, [dataclass_copy(r, 10_000 * (k + 1)) for r in reqs])
      times.append(secs)
    secs = statistics.median(times)
    rows.append({"ray_workers": n, "seconds": secs, "tokens": toks, "tokens_per_s": toks / secs})
    m.close()
  return {"rows": rows}


def dataclass_copy(r: Request, offset: int) -> Request:
  """The same request under a new id (same key: the same tokens)."""
  return Request(r.request_id + offset, r.prompt, r.max_new_tokens, r.key, group_id=r.group_id)

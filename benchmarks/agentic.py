"""Multi-turn episodes: asynchronous episode driver vs a batch-synchronous turn loop (CPU).

Load: 16 problems x 4 samples = 64 episodes of 4 policy turns (16 tokens each) separated by 3
tool calls, on one in-process engine (random-weight model: hidden 128, 4 layers; 64 slots,
decode chunks of 4 steps, row buckets 8-64). Each tool call sleeps a latency drawn per
(episode, turn) from a fixed seed: 0, 50 ms, 1 s, or heavy-tailed (log-normal, median 50 ms,
sigma 1.5: most calls are quick, a few take seconds).

Compared on the same engine and the same episodes (identical tokens):
- async: `agents.EpisodeDriver` (each episode advances on its own: while some wait for tools,
  the others decode);
- barrier: the same driver with `turn_barrier=True` (every episode's turn generated, then
  every tool run, then the next turns: how peers run multi-turn rollout).

Reported: episodes/s; accelerator idle fraction (wall time the engine had nothing to decode
while episodes were in flight); the overlap bound (the run cannot end before the pure
generation time, measured with latency 0, nor before the longest episode's own tool time) and
the async run's fraction of it; and the chain (pure generation plus the longest episode's own
tool time: what the run takes when each turn decodes with the whole batch, since an episode's
tool cannot overlap its own turns; beating it needs decode steps with fewer rows to cost
proportionally less, so that cohorts of episodes could take turns) and the fraction of it.
Also: the prefix-reuse ratio of next turns with sticky sessions vs without (two engines behind
the rollout manager), and lossless prefetch on the search task (a model warmed up on expert
episodes, 200 ms per search; off and on in turn, median wall of 3 runs each): hit rate and tool
time saved.

Each configuration runs 3 times (async and barrier in turn); the table holds the medians.

Run: `python -m benchmarks.agentic [--quick]`; writes benchmarks/results/agentic.json.
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from benchmarks.common import print_table, write_json
from jaxrl_sys import models
from jaxrl_sys.agents import AgentConfig, EpisodeDriver
from jaxrl_sys.rollout import Engine, EngineConfig, InProcessWorker, ManagerConfig, RolloutManager
from jaxrl_sys.tasks import CharTokenizer, SearchEnv, SearchTask, Tool
from jaxrl_sys.tasks.env import EnvStep
from jaxrl_sys.tasks.turns import PlainFormat
from jaxrl_sys.train.loop.groups import group_requests
from jaxrl_sys.train.loop.supervised import supervised_warmup
from jaxrl_sys.train.recipe.presets import MATH_CHARS, tiny_config

TASK = SearchTask(num_entities=128, hops=1, seed=7)
TOK = CharTokenizer(MATH_CHARS + "".join(sorted(set("abcdefghijklmnopqrstuvwxyz?<>\n")
                                                - set(MATH_CHARS))))
CFG = models.ModelConfig(vocab_size=64, hidden_size=128, num_layers=4, num_heads=4,
                         num_kv_heads=2, head_dim=32, intermediate_size=256, max_seq_len=128)
TURNS, TURN_TOKENS, BUDGET = 4, 16, 100


def latency(kind: str, episode: int, turn: int) -> float:
  if kind == "0":
    return 0.0
  if kind == "50ms":
    return 0.05
  if kind == "1s":
    return 1.0
  rng = np.random.default_rng([episode, turn, 11])
  return float(min(0.05 * np.exp(1.5 * rng.standard_normal()), 20.0))


class ToolLatencyEnv:
  """`TURNS` turns whatever the policy writes; each step is a tool call of a drawn latency."""

  def __init__(self, kind: str):
    self.kind = kind

  def reset(self, problem):
    self.problem, self.n = problem, 0
    self.episode = int(problem.meta.get("episode", 0))
    return problem.prompt

  def step(self, action):
    self.n += 1
    if self.n >= TURNS:  # the last turn's answer: no tool
      return EnvStep(None, 0.0, True)
    time.sleep(latency(self.kind, self.episode, self.n - 1))
    return EnvStep(f"result {self.n}", 0.0, False)


class EpisodeTask:
  """The search task's prompts, each problem knowing its episode (for the latency draw)."""

  def problem(self, i):
    p = TASK.problem(i // 4)
    return type(p)(p.prompt, p.answer, dict(p.meta, episode=i))


def session(model, params, ec) -> tuple[RolloutManager, "TimedWorker"]:
  """The embedded rollout session (a manager over one in-process engine) and its timer."""
  worker = InProcessWorker("local-0", model, ec)
  m = RolloutManager([worker])
  m.publish(params, 0)
  return m, TimedWorker(worker)


class TimedWorker:
  """Counts the wall time an in-process worker's engine spends in steps with work."""

  def __init__(self, worker):
    self.busy = 0.0
    server = worker.server
    step = server.step

    def timed():
      if not server.has_work():
        return step()
      t0 = time.perf_counter()
      out = step()
      self.busy += time.perf_counter() - t0
      return out
    server.step = timed


def engine_config(slots=64, **kw):
  """The agentic engine settings (docs/agents.md): short decode chunks (an episode back from its
  tool waits at most `stream_every` steps to join) and row buckets down to 8 (a few live
  episodes decode at the cost of a few rows, not of every slot)."""
  rows = tuple(b for b in (8, 16, 32, 64) if b < slots) + (slots,)
  return EngineConfig(num_slots=slots, max_len=128, prefill_buckets=(32, 128),
                      prefill_batch_buckets=(8,), decode_row_buckets=rows,
                      decode_len_buckets=(128,), stream_every=4, extend_prefixes=True,
                      sampling=models.SamplingConfig(temperature=1.0,
                                                     stop_tokens=(TOK.eos_id,)), **kw)


def requests():
  reqs = group_requests(TASK, TOK, range(16), 4, seed=1, max_new_tokens=BUDGET,
                        max_prompt_len=28)
  for r in reqs:
    r.meta["problem"] = r.request_id  # EpisodeTask: problem i is episode i
  return reqs


def drain(driver, reqs) -> tuple[dict, float]:
  """Submits `reqs` to `driver` and polls until every episode ended: ({request id: finished
  request}, wall seconds)."""
  t0 = time.perf_counter()
  driver.submit(reqs)
  out = {}
  while driver.num_pending():
    for c in driver.poll(min_count=1, timeout=5.0):
      out[c.request_id] = c.request
  return out, time.perf_counter() - t0


def run_episodes(params, kind: str, barrier: bool, model: models.ModelConfig = CFG) -> dict:
  """The 64 episodes at tool latency `kind` on a fresh session of `model` (default `CFG`):
  {wall, busy: engine seconds with work, out: finished requests by id, max_tool}."""
  client, timer = session(model, params, engine_config())
  driver = EpisodeDriver(client, lambda: ToolLatencyEnv(kind), EpisodeTask(), PlainFormat(TOK),
                         AgentConfig(max_turns=TURNS, max_turn_tokens=TURN_TOKENS,
                                     turn_barrier=barrier, prefetch=False, env_workers=64,
                                     check_template=False))
  reqs = requests()
  out, wall = drain(driver, reqs)
  driver.close()
  tool = {r.request_id: sum(latency(kind, r.request_id, t) for t in range(TURNS - 1))
          for r in reqs}
  return {"wall": wall, "busy": timer.busy, "out": out, "max_tool": max(tool.values())}


def episode_row(kind: str, a: dict, s: dict, gen: float) -> dict:
  """The table row of tool latency `kind` from the async (`a`) and barrier (`s`) runs' wall,
  busy and max_tool (`run_episodes`), `gen` the pure generation seconds (latency 0)."""
  bound = max(gen, a["max_tool"])
  return {"tool_latency": kind, "async_ep_per_s": 64 / a["wall"],
          "barrier_ep_per_s": 64 / s["wall"], "speedup": s["wall"] / a["wall"],
          "async_idle": 1 - a["busy"] / a["wall"], "barrier_idle": 1 - s["busy"] / s["wall"],
          "bound_s": bound, "async_s": a["wall"], "barrier_s": s["wall"],
          "of_bound": bound / a["wall"], "chain_s": gen + a["max_tool"],
          "of_chain": (gen + a["max_tool"]) / a["wall"]}


def prefix_reuse(params) -> dict:
  rows = {}
  for sticky in (True, False):
    workers = [InProcessWorker(f"w{i}", CFG, engine_config(32)) for i in range(2)]
    m = RolloutManager(workers, config=ManagerConfig(sticky_sessions=sticky, balance=False))
    m.publish(params, 0)
    driver = EpisodeDriver(m, lambda: ToolLatencyEnv("50ms"), EpisodeTask(), PlainFormat(TOK),
                           AgentConfig(max_turns=TURNS, max_turn_tokens=TURN_TOKENS,
                                       prefetch=False, check_template=False))
    driver.submit(requests())
    while driver.num_pending():
      driver.poll(min_count=64, timeout=5.0)
    stats = [w.engine.stats for w in workers]
    reused = sum(s.reused_tokens for s in stats)
    prefilled = sum(s.prefill_tokens + s.extend_tokens for s in stats)
    rows[sticky] = reused / max(reused + prefilled, 1)
    driver.close()
  return {"reuse_sticky": rows[True], "reuse_not_sticky": rows[False]}


class SlowSearchEnv(SearchEnv):
  def __init__(self):
    super().__init__(TASK)
    fast = self.tools[0].fn
    tool = Tool("search", lambda q: (time.sleep(0.2), fast(q))[1], read_only=True)
    self.tools, self.by_name = (tool,), {"search": tool}


def prefetch(quick: bool) -> list[dict]:
  mc = tiny_config(TOK.vocab_size, 80)
  params = models.init_params(mc, jax.random.PRNGKey(0))
  params = supervised_warmup(params, mc, TASK, TOK, steps=60 if quick else 200, batch_size=32,
                             learning_rate=3e-3, seq_len=80)
  runs: dict[bool, list[dict]] = {False: [], True: []}
  # None: a first pass that compiles, not reported; then off and on in turn, 3 runs each
  for on in (None,) + (False, True) * 3:
    ec = EngineConfig(num_slots=64, max_len=80, prefill_buckets=(80,), prefill_batch_buckets=(8,),
                      decode_row_buckets=(64,), decode_len_buckets=(80,), stream_every=4,
                      extend_prefixes=True,
                      sampling=models.SamplingConfig(temperature=1.0, stop_tokens=(TOK.eos_id,)))
    client, _ = session(mc, params, ec)
    driver = EpisodeDriver(client, SlowSearchEnv, TASK, PlainFormat(TOK),
                           AgentConfig(max_turns=3, prefetch=bool(on), tool_workers=64,
                                       check_template=False))
    reqs = group_requests(TASK, TOK, range(16), 4, seed=2, max_new_tokens=64, max_prompt_len=16)
    out, wall = drain(driver, reqs)
    m = driver.metrics()
    driver.close()
    if on is not None:
      runs[on].append({"wall": wall, "out": out, "m": m})
  rows = []
  for on, rs in runs.items():
    m, out = rs[-1]["m"], rs[-1]["out"]
    wall = float(np.median([r["wall"] for r in rs]))
    rows.append({"prefetch": on, "episodes_per_s": len(out) / wall, "wall_s_median_of_3": wall,
                 "success": float(np.mean([r.meta["episode"]["success"] for r in out.values()])),
                 "hits": m.get("agent_prefetch_hits", 0.0),
                 "hit_rate": m.get("agent_prefetch_hits", 0.0) / max(
                     m.get("agent_prefetch_started", 0.0), 1.0),
                 "tool_s_saved": m.get("agent_prefetch_seconds_saved", 0.0),
                 "identical_tokens": all(
                     {k: c.tokens.tolist() for k, c in r["out"].items()}
                     == {k: c.tokens.tolist() for k, c in runs[False][0]["out"].items()}
                     for r in runs[False] + runs[True])})
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true",
                  help="latencies 0 and heavy-tailed only, one run each (default: medians of 3)")
  args = ap.parse_args()
  params = models.init_params(CFG, jax.random.PRNGKey(0))
  Engine(CFG, params, engine_config()).warmup()  # compiles every program first
  run_episodes(params, "0", False)
  kinds = ["0", "heavy"] if args.quick else ["0", "50ms", "1s", "heavy"]
  rows, gen = [], None
  repeats = 1 if args.quick else 3
  for kind in kinds:
    res = {}
    for b in (False, True) * repeats:  # async and barrier in turn; medians of the repeats
      res.setdefault(b, []).append(run_episodes(params, kind, b))
    for runs in res.values():
      for r in runs:
        assert r["out"].keys() == res[False][0]["out"].keys()
        for e, x in r["out"].items():
          assert (x.tokens == res[False][0]["out"][e].tokens).all(), "episodes differ"
    a, s = ({k: float(np.median([r[k] for r in res[b]])) for k in ("wall", "busy", "max_tool")}
            for b in (False, True))
    if kind == "0":  # pure generation: the faster of the two with instant tools
      gen = min(a["wall"], s["wall"])
    rows.append(episode_row(kind, a, s, gen))
  print_table(rows)
  reuse = prefix_reuse(params)
  print_table([reuse])
  pre = prefetch(args.quick)
  print_table(pre)
  write_json("agentic", {"episodes": rows, "prefix_reuse": reuse, "prefetch": pre,
                         "load": {"episodes": 64, "turns": TURNS, "turn_tokens": TURN_TOKENS,
                                  "model": "hidden 128, 4 layers, vocab 64"}})


if __name__ == "__main__":
  main()

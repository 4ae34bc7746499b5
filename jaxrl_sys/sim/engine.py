"""The generation engine of one simulated rollout instance: continuous batching on virtual time.

An engine holds sequences (prompt length, tokens so far, a target length) and advances them in
decode steps whose duration comes from the preset's `DecodeCurve`:

    step_time = fixed_s + per_seq_s * B + per_ctx_token_s * S          [s]

with B running sequences and S the sum of their contexts (prompt + tokens so far). Between two
events (a finish, a KV-cache overflow, an admission, a new arrival) B is constant and S grows by
B per step, so k steps take

    dur(k) = k * (fixed_s + per_seq_s * B + per_ctx_token_s * S) + per_ctx_token_s * B * k(k-1)/2

and the engine jumps from event to event in closed form; per-sequence counters are lazy
(`tokens = gen0 + steps - s0`), so a step costs nothing and an event O(log n).

Admission (SGLang-like, `EngineModel`): waiting sequences start in FIFO order while fewer than
`max_running` run and the KV cache keeps `kv_headroom` tokens of room per running sequence; each
admission batch pays one prefill over the new tokens (a shared GRPO prompt is prefilled once per
engine: prefix cache; a resumed request also re-reads its tokens so far - the cost of migration).
When the growing contexts overflow the cache, the newest sequences are retracted to the front of
the queue (their KV is dropped and recomputed at re-admission) until `retract_reserve` steps of
growth fit.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import math

from jaxrl_sys.sim.presets import ModelPreset
from jaxrl_sys.sim.timing import prefill_time


@dataclasses.dataclass(frozen=True)
class EngineModel:
  """Scheduler and reporting settings of a simulated instance (times in virtual seconds).

  Attributes:
    max_running: most sequences decoded together (SGLang's max running requests / CUDA-graph
      batch bound; an assumption of that order).
    kv_headroom: KV tokens kept free per running sequence when admitting (stands in for
      SGLang's reservation of `new_token_ratio` x remaining budget, ~0.1 x 14K).
    retract_reserve: after a KV overflow, retract until this many decode steps of growth fit.
    report_interval: seconds between reports when nothing finished (heartbeat; streamed tokens).
    min_report_interval: a report with news (a finish, an admission, an abort acknowledgement, a
      finished weight pull) is sent this long after the previous one at the earliest.
    command_latency: seconds before an exchange returns when the manager has commands for the
      worker (the Ray worker's long poll answers within 50 ms).
    stream_interval: seconds between reports that carry the tokens of running requests (finished
      and aborted requests always carry theirs).
    stream_tokens: the engine streams tokens in chunks of this many (SGLang `--stream-interval`
      10 in RLBoost's release): a preempted instance loses at most this many per request.
  """
  max_running: int = 256
  kv_headroom: int = 1024
  retract_reserve: int = 128
  report_interval: float = 10.0
  min_report_interval: float = 0.2
  command_latency: float = 0.05
  stream_interval: float = 30.0
  stream_tokens: int = 10

  def __post_init__(self):
    if not (self.max_running >= 1 and self.kv_headroom >= self.retract_reserve >= 1
            and self.report_interval >= self.min_report_interval > 0 and self.command_latency > 0
            and self.stream_interval > 0 and self.stream_tokens >= 1):
      raise ValueError(f"EngineModel: need max_running >= 1, kv_headroom >= retract_reserve >= 1,"
                       f" report_interval >= min_report_interval > 0, stream_interval > 0 and "
                       f"stream_tokens >= 1; got {self}")


class Seq:
  """One request on an engine. While running, its tokens so far are `gen0 + steps - s0`
  (`steps` = the engine's decode-step counter); while waiting, `gen0`."""
  __slots__ = ("rid", "group", "prompt", "gen0", "s0", "target", "budget", "reported",
               "start_here", "arrive")

  def __init__(self, rid: int, group: int, prompt: int, generated: int, target: int, budget: int,
               arrive: float):
    self.rid, self.group, self.prompt, self.arrive = rid, group, prompt, arrive
    self.target, self.budget = max(min(target, budget), generated), budget
    self.gen0 = self.reported = self.start_here = generated
    self.s0 = 0


class SimEngine:
  """Continuous batching of `Seq`s on virtual time (see the module docstring)."""

  def __init__(self, preset: ModelPreset, model: EngineModel, t0: float = 0.0):
    d = preset.decode
    self.preset, self.model = preset, model
    self.a, self.p, self.c = d.fixed_s, d.per_seq_s, d.per_ctx_token_s
    self.cap = float(d.kv_capacity_tokens) if d.kv_capacity_tokens else math.inf
    self.t = float(t0)          # virtual time simulated up to (<= the clock)
    self.steps = 0              # decode steps so far
    self.running: dict[int, Seq] = {}
    self.heap: list[tuple[int, int]] = []  # (finish step, rid), lazily cleaned
    self.base = 0               # sum over running of prompt + gen0 - s0
    self.waiting: collections.deque[Seq] = collections.deque()
    self.prefill_end = -math.inf
    self.frozen_at: float | None = None
    self.finished: list[tuple[Seq, float]] = []  # (seq, time) since the last take
    self.profile: list[tuple[int, int, float]] = []
    self.cached: set[int] = set()  # groups whose prompt KV this engine holds
    self.decoded = self.prefilled = self.retracted = 0
    self.changed = False        # the running set changed since the last report

  # ----- queries -------------------------------------------------------------------------------
  def used(self) -> int:
    """KV tokens in use: the running sequences' contexts."""
    return self.base + len(self.running) * self.steps

  def tokens(self, s: Seq) -> int:
    """Tokens `s` has generated so far (up to the engine's time)."""
    return s.gen0 + self.steps - s.s0 if s.rid in self.running else s.gen0

  def held(self) -> list[Seq]:
    return list(self.running.values()) + list(self.waiting)

  def effective_slots(self) -> int:
    """Sequences it could run now: running + what the free KV holds at their mean context."""
    b = len(self.running)
    if math.isinf(self.cap):
      return self.model.max_running
    per = max(self.used() / b if b else 0.0, 1.0) + self.model.kv_headroom
    room = int(max(self.cap - self.used(), 0.0) // per)
    return max(1, min(self.model.max_running, b + room))

  # ----- commands ------------------------------------------------------------------------------
  def add(self, s: Seq) -> None:
    self.waiting.append(s)

  def remove(self, rid: int) -> Seq | None:
    """Takes `rid` out (an abort); returns it with `gen0` = its tokens so far, or None."""
    s = self.running.pop(rid, None)
    if s is not None:
      s.gen0 = s.gen0 + self.steps - s.s0
      self.base -= s.prompt + s.gen0 - self.steps
      return s
    for i, w in enumerate(self.waiting):
      if w.rid == rid:
        del self.waiting[i]
        return w
    return None

  def freeze(self, now: float) -> None:
    """The instance's GPUs are taken (the trainer trains): no progress until `thaw`."""
    if self.frozen_at is None:
      self.advance(now)
      self.frozen_at = now

  def thaw(self, now: float) -> None:
    if self.frozen_at is not None:
      shift = now - self.frozen_at
      self.frozen_at = None
      if self.prefill_end > self.t:
        self.prefill_end += shift
      self.t += shift

  # ----- time ----------------------------------------------------------------------------------
  def _dur(self, k: int, b: int) -> float:
    return k * (self.a + self.p * b + self.c * self.used()) + self.c * b * k * (k - 1) / 2

  def _within(self, tau: float, b: int) -> int:
    """Most whole decode steps that fit in `tau` seconds at batch `b`."""
    if tau <= 0:
      return 0
    q = self.c * b / 2
    lin = self.a + self.p * b + self.c * self.used() - q
    k = int(tau / lin) if q == 0 else int((-lin + math.sqrt(lin * lin + 4 * q * tau)) / (2 * q))
    while self._dur(k + 1, b) <= tau:
      k += 1
    while k > 0 and self._dur(k, b) > tau:
      k -= 1
    return k

  def _next_finish(self) -> int | None:
    """Steps until the next running sequence finishes (None when none runs)."""
    h = self.heap
    while h:
      step, rid = h[0]
      s = self.running.get(rid)
      if s is not None and s.s0 + s.target - s.gen0 == step:
        return step - self.steps
      heapq.heappop(h)
    return None

  def _next_k(self) -> int:
    """Decode steps to the next event (>= 1): a finish, a KV overflow or an arrival."""
    b = len(self.running)
    k = self._next_finish()
    k_kv = int((self.cap - self.used()) // b) if not math.isinf(self.cap) else k
    k = min(k, k_kv)
    if self.waiting and self.waiting[0].arrive > self.t:
      gap = self.waiting[0].arrive - self.t
      k_a = self._within(gap, b)
      k = min(k, k_a + (self._dur(k_a, b) < gap))
    return max(k, 1)

  def next_event(self) -> float:
    """Virtual time of the engine's next event after `self.t` (inf: nothing to do)."""
    if self.frozen_at is not None:
      return math.inf
    if self.prefill_end > self.t:
      return self.prefill_end
    if not self.running:
      return self.waiting[0].arrive if self.waiting and self.waiting[0].arrive > self.t \
          else math.inf
    return self.t + self._dur(self._next_k(), len(self.running))

  def advance(self, until: float) -> None:
    """Simulates up to virtual time `until` (stops at the last step boundary before it)."""
    if self.frozen_at is not None:
      return
    while self.t < until:
      if self.prefill_end > self.t:
        if self.prefill_end > until:
          return
        self.t = self.prefill_end
      if self._admit():
        continue
      b = len(self.running)
      if b == 0:
        if self.waiting and self.t < self.waiting[0].arrive <= until:
          self.t = self.waiting[0].arrive
          continue
        self.t = until
        return
      k_fin = self._next_finish()
      if k_fin <= 0:
        self._finish_due()
        continue
      if b > 1 and self.used() > self.cap - b:
        self._retract()
        continue
      k = self._next_k()
      if self.t + self._dur(k, b) > until:
        k = self._within(until - self.t, b)
        if k:
          self._decode(k, b)
        return
      self._decode(k, b)
    if self.running and self._next_finish() <= 0:
      self._finish_due()

  def _decode(self, k: int, b: int) -> None:
    dt = self._dur(k, b)
    self.t += dt
    self.steps += k
    self.decoded += k * b
    self.profile.append((b, k * b, dt))

  def _finish_due(self) -> None:
    while True:
      k = self._next_finish()
      if k is None or k > 0:
        return
      _, rid = heapq.heappop(self.heap)
      s = self.running.pop(rid)
      self.base -= s.prompt + s.gen0 - s.s0
      s.gen0 = s.target
      self.finished.append((s, self.t))
      self.changed = True

  def _retract(self) -> None:
    """KV overflow: drop the newest sequences' KV (they wait at the front, tokens kept)."""
    reserve = self.model.retract_reserve
    while len(self.running) > 1 and self.cap - self.used() < len(self.running) * reserve:
      s = max(self.running.values(), key=lambda x: (x.s0, x.rid))
      self.remove(s.rid)
      s.arrive = self.t
      self.waiting.appendleft(s)
      self.retracted += 1
      self.changed = True

  def _admit(self) -> bool:
    """Starts waiting sequences that fit; True when a prefill began."""
    m, w = self.model, self.waiting
    if not w or w[0].arrive > self.t or len(self.running) >= m.max_running:
      return False
    used, b, new_tokens, sq, ctx_sum = self.used(), len(self.running), 0, 0.0, 0
    while w and w[0].arrive <= self.t and b < m.max_running:
      s = w[0]
      ctx = s.prompt + s.gen0
      if b and used + ctx + m.kv_headroom * (b + 1) > self.cap:
        break
      w.popleft()
      s.s0 = self.steps
      self.running[s.rid] = s
      self.base += s.prompt + s.gen0 - self.steps
      heapq.heappush(self.heap, (self.steps + s.target - s.gen0, s.rid))
      new_tokens += s.gen0 + (0 if s.group in self.cached else s.prompt)
      self.cached.add(s.group)
      sq += ctx * ctx
      ctx_sum += ctx
      used, b = used + ctx, b + 1
      self.changed = True
    if not new_tokens:
      return False
    self.prefilled += new_tokens
    self.prefill_end = self.t + prefill_time(self.preset, new_tokens, sq / ctx_sum)
    return True

  def take_finished(self) -> list[tuple[Seq, float]]:
    out, self.finished = self.finished, []
    return out

  def take_profile(self) -> list[tuple[int, int, float]]:
    out, self.profile = self.profile, []
    return out

"""The generation engine of one simulated rollout instance: continuous batching on virtual time.

An engine holds sequences (prompt length, tokens so far, a target length) and advances them in
decode steps whose duration comes from the preset's `DecodeCurve`:

    step_time = max(host_s, fixed_s + per_seq_s * B + per_ctx_token_s * S)          [s]

with B running sequences and S the sum of their contexts (prompt + tokens so far). Between two
events (a finish, a KV-cache overflow, an admission, a new arrival) B is constant and S grows by
B per step, so with g = fixed_s + per_seq_s * B + per_ctx_token_s * S the GPU time of the next
step, the first m = ceil((host_s - g) / (per_ctx_token_s * B)) steps are host-bound and k steps
take

    dur(k) = m' host_s + G(k) - G(m'),  m' = min(k, m),  G(n) = n g + per_ctx_token_s B n(n-1)/2

and the engine jumps from event to event in closed form; per-sequence counters are lazy
(`tokens = gen0 + steps - s0`), so a step costs nothing and an event O(log n).

Admission follows SGLang's scheduler (`EngineModel`): waiting sequences start in FIFO order
while the KV cache holds their context plus a reservation for the growth of every running one,
`ratio x min(budget, 4096)` tokens each; the ratio starts at 0.7 when the engine is idle and
decays to 0.098 over 600 decode steps (SGLang's new-token-ratio estimate with its default
constants and its clip of the budget at 4,096). Each admission batch pays one prefill over the
new tokens (a shared GRPO prompt is prefilled once per engine: prefix cache; a resumed request
also re-reads its tokens so far - the cost of migration). When the growing contexts overflow the
cache, the newest sequences are retracted to the front of the queue (their KV is dropped and
recomputed at re-admission) until 20 steps of growth fit, and the ratio is re-estimated from
the tokens decoded so far, as SGLang does.
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
    max_running: most sequences decoded together (SGLang derives its cap from the token pool;
      this bound only matters for small contexts).
    reserve_init / reserve_min / reserve_decay_steps / reserve_clip: the KV reservation for
      running sequences (SGLang defaults: 0.7, 0.7 x 0.14, 600 steps, budgets clipped at 4,096).
    retract_steps: after a KV overflow, retract until this many decode steps fit (SGLang: 20).
    admit_every: while a KV-blocked sequence waits and the ratio is still decaying, admission is
      re-checked every this many decode steps (SGLang checks every step).
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
  max_running: int = 1024
  reserve_init: float = 0.7
  reserve_min: float = 0.098
  reserve_decay_steps: int = 600
  reserve_clip: int = 4096
  retract_steps: int = 20
  admit_every: int = 64
  report_interval: float = 10.0
  min_report_interval: float = 0.2
  command_latency: float = 0.05
  stream_interval: float = 30.0
  stream_tokens: int = 10

  def __post_init__(self):
    if not (self.max_running >= 1 and 0 <= self.reserve_min <= self.reserve_init <= 1
            and self.reserve_decay_steps >= 1 and self.reserve_clip >= 1
            and self.retract_steps >= 1 and self.admit_every >= 1
            and self.report_interval >= self.min_report_interval > 0 and self.command_latency > 0
            and self.stream_interval > 0 and self.stream_tokens >= 1):
      raise ValueError(f"EngineModel: counts must be >= 1, 0 <= reserve_min <= reserve_init <= 1"
                       f", report_interval >= min_report_interval > 0, intervals > 0; got {self}")

  @property
  def reserve_decay(self) -> float:
    return (self.reserve_init - self.reserve_min) / self.reserve_decay_steps


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
    self.a, self.p, self.c, self.h = d.fixed_s, d.per_seq_s, d.per_ctx_token_s, d.host_s
    self.cap = float(d.kv_capacity_tokens) if d.kv_capacity_tokens else math.inf
    self.t = float(t0)          # virtual time simulated up to (<= the clock)
    self.steps = 0              # decode steps so far
    self.running: dict[int, Seq] = {}
    self.heap: list[tuple[int, int]] = []  # (finish step, rid), lazily cleaned
    self.base = 0               # sum over running of prompt + gen0 - s0 (context = base + B steps)
    self.gen_base = 0           # sum over running of gen0 - s0
    self.clip_sum = 0           # sum over running of min(budget, reserve_clip)
    self.budget_sum = 0         # sum over running of budget
    self.ratio0, self.ratio_step = model.reserve_init, 0
    self.waiting: collections.deque[Seq] = collections.deque()
    self.prefill_end = -math.inf
    self.frozen_at: float | None = None
    self.finished: list[tuple[Seq, float]] = []  # (seq, time) since the last take
    self.profile: list[tuple[int, int, float]] = []
    self.cached: set[int] = set()  # groups whose prompt KV this engine holds
    self.last_prompt = 256
    self.decoded = self.prefilled = self.retracted = 0
    self.changed = False        # the running set changed since the last report

  # ----- queries -------------------------------------------------------------------------------
  def used(self) -> int:
    """KV tokens in use: the running sequences' contexts."""
    return self.base + len(self.running) * self.steps

  def ratio(self) -> float:
    """SGLang's new-token ratio now (decays per decode step towards `reserve_min`)."""
    m = self.model
    return max(self.ratio0 - m.reserve_decay * (self.steps - self.ratio_step), m.reserve_min)

  def free(self) -> float:
    """KV tokens free after the running sequences' reservation."""
    return self.cap - self.used() - self.ratio() * self.clip_sum

  def tokens(self, s: Seq) -> int:
    """Tokens `s` has generated so far (up to the engine's time)."""
    return s.gen0 + self.steps - s.s0 if s.rid in self.running else s.gen0

  def held(self) -> list[Seq]:
    return list(self.running.values()) + list(self.waiting)

  def effective_slots(self) -> int:
    """Sequences it could run now: running + new ones (of the last prompt length) that fit."""
    b, m = len(self.running), self.model
    if math.isinf(self.cap):
      return m.max_running
    per = self.last_prompt + self.ratio() * m.reserve_clip
    return max(1, min(m.max_running, b + int(max(self.free(), 0.0) // per)))

  # ----- commands ------------------------------------------------------------------------------
  def add(self, s: Seq) -> None:
    self.waiting.append(s)
    self.last_prompt = s.prompt

  def remove(self, rid: int) -> Seq | None:
    """Takes `rid` out (an abort); returns it with `gen0` = its tokens so far, or None."""
    s = self.running.get(rid)
    if s is not None:
      self._stop(s)
      return s
    for i, w in enumerate(self.waiting):
      if w.rid == rid:
        del self.waiting[i]
        return w
    return None

  def _start(self, s: Seq) -> None:
    s.s0 = self.steps
    self.running[s.rid] = s
    self.base += s.prompt + s.gen0 - s.s0
    self.gen_base += s.gen0 - s.s0
    self.clip_sum += min(s.budget, self.model.reserve_clip)
    self.budget_sum += s.budget
    heapq.heappush(self.heap, (s.s0 + s.target - s.gen0, s.rid))
    self.changed = True

  def _stop(self, s: Seq) -> None:
    """`s` leaves the batch; its `gen0` becomes its tokens so far."""
    del self.running[s.rid]
    self.base -= s.prompt + s.gen0 - s.s0
    self.gen_base -= s.gen0 - s.s0
    self.clip_sum -= min(s.budget, self.model.reserve_clip)
    self.budget_sum -= s.budget
    s.gen0 += self.steps - s.s0
    s.s0 = self.steps
    self.changed = True
    if not self.running:  # SGLang resets its estimate when the batch empties
      self.ratio0, self.ratio_step = self.model.reserve_init, self.steps

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
  def _host_steps(self, b: int) -> float:
    """How many of the next steps at batch `b` are host-bound (their GPU time below `host_s`;
    the GPU time grows by per_ctx_token_s x b a step as the contexts grow)."""
    g0, q = self.a + self.p * b + self.c * self.used(), self.c * b
    if self.h <= g0:
      return 0
    return math.inf if q == 0 else math.ceil((self.h - g0) / q)

  def _dur(self, k: int, b: int) -> float:
    """Seconds of the next `k` decode steps at batch `b`: each the longer of the host's work
    (`host_s`) and the GPU's (`fixed_s + per_seq_s b + per_ctx_token_s x contexts`)."""
    g0, q = self.a + self.p * b + self.c * self.used(), self.c * b
    gpu = lambda n: n * g0 + q * n * (n - 1) / 2  # noqa: E731  (sum of the first n GPU times)
    m = min(k, self._host_steps(b))
    return m * self.h + gpu(k) - gpu(m)

  def _within(self, tau: float, b: int) -> int:
    """Most whole decode steps that fit in `tau` seconds at batch `b`."""
    if tau <= 0:
      return 0
    m = self._host_steps(b)
    if tau <= m * self.h:  # all host-bound
      k = int(tau / self.h)
    else:  # m host-bound steps, then GPU-bound ones from the GPU time after them
      rest = tau - m * self.h
      q = self.c * b / 2
      lin = self.a + self.p * b + self.c * self.used() + 2 * q * m - q
      k = m + (int(rest / lin) if q == 0 else
               int((-lin + math.sqrt(lin * lin + 4 * q * rest)) / (2 * q)))
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
    """Decode steps to the next event (>= 1): a finish, a KV overflow, an arrival, or an
    admission re-check while the reservation ratio decays."""
    b, m = len(self.running), self.model
    k = self._next_finish()
    if not math.isinf(self.cap):
      k = min(k, int((self.cap - self.used()) // b))
    if self.waiting and b < m.max_running:
      head = self.waiting[0]
      if head.arrive > self.t:
        gap = head.arrive - self.t
        k_a = self._within(gap, b)
        k = min(k, k_a + (self._dur(k_a, b) < gap))
      elif self.ratio() > m.reserve_min:
        k = min(k, m.admit_every)
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
    while True:
      if self.prefill_end > self.t:
        if self.prefill_end > until:
          return
        self.t = self.prefill_end
      if self._admit():
        continue
      b = len(self.running)
      if b and self._next_finish() <= 0:
        self._finish_due()
        continue
      if self.t >= until:
        return
      if b == 0:
        if self.waiting and self.t < self.waiting[0].arrive <= until:
          self.t = self.waiting[0].arrive
          continue
        self.t = until
        return
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
      s = self.running[rid]
      self._stop(s)
      self.finished.append((s, self.t))

  def _retract(self) -> None:
    """KV overflow: drop the newest sequences' KV (they wait at the front, tokens kept) until
    `retract_steps` steps fit; re-estimate the ratio from the tokens decoded so far."""
    m = self.model
    while len(self.running) > 1 and self.cap - self.used() < len(self.running) * m.retract_steps:
      s = max(self.running.values(), key=lambda x: (x.s0, x.rid))
      self._stop(s)
      s.arrive = self.t
      self.waiting.appendleft(s)
      self.retracted += 1
    b = len(self.running)
    decoded = self.gen_base + b * self.steps
    self.ratio0 = min(1.0, (decoded + m.retract_steps * b) / max(self.budget_sum, 1))
    self.ratio_step = self.steps

  def _admit(self) -> bool:
    """Starts waiting sequences that fit; True when a prefill began."""
    m, w = self.model, self.waiting
    if not w or w[0].arrive > self.t or len(self.running) >= m.max_running:
      return False
    new_tokens, sq, ctx_sum, ratio = 0, 0.0, 0, self.ratio()
    while w and w[0].arrive <= self.t and len(self.running) < m.max_running:
      s = w[0]
      ctx = s.prompt + s.gen0
      need = ctx + ratio * min(s.budget, m.reserve_clip)
      if self.running and need > self.free():
        break
      w.popleft()
      self._start(s)
      new_tokens += s.gen0 + (0 if s.group in self.cached else s.prompt)
      self.cached.add(s.group)
      sq += ctx * ctx
      ctx_sum += ctx
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

"""The rollout manager's requests: every unfinished request's token state (the single source of
truth: prompt, tokens so far, their logprobs and per-token weight versions), the dispatch
queue, completions, token provenance, what a migrated request keeps, abort bookkeeping, and the
sticky sessions (the worker that finished each session's last request, `session_worker`).

`RequestTable` is private to `manager/`: `core.ManagerCore` drives it (which worker holds a
request is the core's business; the worker's side of a chunk is `state.WorkerState`'s).
Outside `manager/`, `RolloutManager.snapshot` copies the token state and
`FleetView.provenance` reads who produced which tokens.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable, Sequence

from jaxrl_sys.rollout.manager.config import ManagerConfig
from jaxrl_sys.rollout.manager.state import Ledger, ReqState, WorkerState
from jaxrl_sys.rollout.types import Completion, FinishReason, Request, TokenChunk


class RequestTable:
  """Requests by id, the queue of ids waiting for dispatch (`queue`, in order) and the
  completions waiting for `poll` (see the module docstring).

  Args:
    config: the manager's settings (migration ablations).
    ledger: where counters and provenance go.
  """

  def __init__(self, config: ManagerConfig, ledger: Ledger):
    self._config, self._ledger = config, ledger
    self._reqs: dict[int, ReqState] = {}
    self.queue: collections.deque[int] = collections.deque()
    self._done: list[Completion] = []
    self._open = 0  # unfinished requests
    # Sticky sessions: session -> the worker that finished its last request (LRU, bounded).
    self._sessions: collections.OrderedDict[Any, str] = collections.OrderedDict()

  def get(self, request_id: int) -> ReqState | None:
    return self._reqs.get(request_id)

  def __getitem__(self, request_id: int) -> ReqState:
    return self._reqs[request_id]

  def __len__(self) -> int:
    """Requests submitted and not yet returned (completions waiting for `poll` included)."""
    return len(self._reqs)

  @property
  def num_open(self) -> int:
    """Requests submitted and not finished."""
    return self._open

  def num_done(self) -> int:
    return len(self._done)

  def submit(self, requests: Sequence[Request], now: float) -> None:
    """Queues fresh or partial requests (copies of them)."""
    batch = list(requests)
    ids = [r.request_id for r in batch]
    if len(set(ids)) != len(ids):
      raise ValueError(f"duplicate request ids in one submit: {sorted(ids)}")
    for r in batch:
      if r.request_id in self._reqs:
        raise ValueError(f"request {r.request_id} is already in flight in the rollout manager")
    for r in batch:
      self._reqs[r.request_id] = ReqState(dataclasses.replace(r), submitted_at=now)
      self._ledger.provenance[r.request_id] = []
      self.queue.append(r.request_id)
    self._open += len(batch)
    self._ledger.stats.submitted += len(batch)

  def session_worker(self, r: Request) -> str | None:
    """Sticky sessions (`ManagerConfig.sticky_sessions`): the worker that finished the previous
    request of `r`'s session (`meta["session"]`, e.g. the previous turn of an episode), whose
    engine may still hold the session's KV; None when `r` has no session or none is known.
    The worker may be gone: placement only prefers it among the workers that qualify."""
    if not self._config.sticky_sessions:
      return None
    session = r.meta.get("session")
    return None if session is None else self._sessions.get(session)

  def _served(self, r: Request, worker_id: str) -> None:
    session = r.meta.get("session") if self._config.sticky_sessions else None
    if session is None:
      return
    self._sessions[session] = worker_id
    self._sessions.move_to_end(session)
    while len(self._sessions) > self._config.max_sessions:
      self._sessions.popitem(last=False)

  def snapshot(self) -> list[Request]:
    """Copies of every unfinished request's token state (id order)."""
    return [dataclasses.replace(st.request) for rid, st in sorted(self._reqs.items())
            if not st.done]

  def take_completions(self) -> list[Completion]:
    """The completions finished since the last call; their requests are forgotten."""
    out, self._done = self._done, []
    for c in out:
      self._reqs.pop(c.request_id, None)
    return out

  def queued_min_versions(self) -> list[int]:
    """The distinct `min_version`s of the queued requests, sorted (for stall reports)."""
    return sorted({self._reqs[r].request.min_version for r in self.queue})

  def unfinished(self, request_ids: Iterable[int] | None) -> list[int]:
    """The ids of `request_ids` (all when None) that are known and not finished."""
    reqs = self._reqs
    if request_ids is None:
      return [rid for rid, st in reqs.items() if not st.done]
    return [int(r) for r in request_ids if int(r) in reqs and not reqs[int(r)].done]

  def drop(self, request_id: int) -> Request:
    """Forgets a request (returned by an abort) and returns its token state."""
    st = self._reqs.pop(request_id)
    if not st.done:
      self._open -= 1
    if request_id in self.queue:
      self.queue.remove(request_id)
    return st.request

  def abort_waiting(self, want: Sequence[int]) -> bool:
    """Some request of `want` being aborted still has an owner to acknowledge it."""
    reqs = self._reqs
    return any(reqs[r].owner is not None for r in want if r in reqs and reqs[r].aborting)

  def abort_owners(self, want: Sequence[int]) -> list[str]:
    """The owners of `want`'s requests (sorted, as text), for a missing acknowledgement."""
    return sorted({str(self._reqs[r].owner) for r in want if r in self._reqs})

  def end_abort(self, want: Sequence[int], dropped: Sequence[Request]) -> list[Request]:
    """Drops the acknowledged aborted requests of `want`; returns their token state with the
    `dropped` ones (those queued when the abort began), in id order."""
    out = list(dropped)
    for rid in want:
      st = self._reqs.get(rid)
      if st is not None and st.aborting and not st.done:
        if rid in self.queue:
          self.queue.remove(rid)
        out.append(self.drop(rid))
    self._ledger.stats.aborted += len(out)
    return sorted(out, key=lambda r: r.request_id)

  def acknowledged(self, st: ReqState) -> None:
    """The owner let go of `st` (abort acknowledged): an abort collects it, a move re-queues
    it."""
    st.owner = None
    if st.moving and not st.aborting:
      st.moving = False
      self.queue.appendleft(st.request.request_id)
      self._ledger.stats.balanced += 1

  def cut_migrated(self, ids: list[int]) -> None:
    """What a migrated request keeps: every token (ours); or, as ablations, nothing
    (`migrate_tokens=False`: restart from the prompt) or the shortest sibling's length of its
    group (`trim_siblings=True`, RLBoost's released retry path)."""
    keep = {rid: self._reqs[rid].request.num_generated for rid in ids}
    if self._config.trim_siblings:
      shortest: dict[int, int] = {}
      for rid in ids:
        g = self._reqs[rid].request.group_id
        shortest[g] = min(shortest.get(g, keep[rid]), keep[rid])
      keep = {rid: shortest[self._reqs[rid].request.group_id] for rid in ids}
    if not self._config.migrate_tokens:
      keep = dict.fromkeys(ids, 0)
    stats, provenance = self._ledger.stats, self._ledger.provenance
    for rid in ids:
      r, n = self._reqs[rid].request, keep[rid]
      stats.tokens_kept += n
      stats.tokens_discarded += r.num_generated - n
      if n < r.num_generated:
        r.truncate(n)
        prov = provenance.get(rid, [])
        provenance[rid] = [(w, a, min(b, n)) for w, a, b in prov if a < n]

  def on_chunk(self, ws: WorkerState, c: TokenChunk, now: float) -> None:
    """A chunk from worker `ws`: extends its request when `ws` owns it and the chunk starts at
    the tokens so far (late or duplicated chunks are ignored), finishes it on its last chunk,
    or acknowledges an abort."""
    st = self._reqs.get(c.request_id)
    wid, stats = ws.worker_id, self._ledger.stats
    if st is None or st.done or st.owner != wid:
      stats.ignored_chunks += 1
      return
    if c.finish == FinishReason.ABORTED:
      if st.moving or st.aborting:
        ws.release(c.request_id, now)
        self.acknowledged(st)
      else:
        stats.ignored_chunks += 1
      return
    if c.start != st.request.num_generated:
      stats.ignored_chunks += 1
      return
    n = len(c.tokens)
    if n:
      st.request.extend(c.tokens, c.logprobs, c.version, c.routes)
      prov = self._ledger.provenance[c.request_id]
      if prov and prov[-1][0] == wid and prov[-1][2] == c.start:
        prov[-1] = (wid, prov[-1][1], c.start + n)
      else:
        prov.append((wid, c.start, c.start + n))
      stats.tokens += n
      if ws.local:
        stats.tokens_local += n
    if c.finish is not None:
      ws.last_done = now
      ws.release(c.request_id, now)
      self._served(st.request, wid)
      st.done, st.owner, st.moving = True, None, False
      self._open -= 1
      self._done.append(Completion(st.request, c.finish))
      stats.completed += 1

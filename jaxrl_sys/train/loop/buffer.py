"""The host-side rollout buffer: groups of samples in flight, and their exact serialisation.

A group is the S samples of one prompt; its id is the prompt's data index (so the problem is
`task.problem(group_id)`) and sample j has request id `group_id * S + j` and the key
`request_key(seed, request_id)`. Everything is deterministic in (seed, group id).

Between train steps the buffer holds complete groups not yet trained on, finished samples of
incomplete groups, and the partial state of aborted requests (prompt + tokens so far, with their
log-probs and weight versions). `to_json` / `from_json` write it as plain JSON (`rollout.wire`:
arrays as base64 of little-endian bytes with dtype and shape; exact, no pickles).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from jaxrl_sys.rollout.types import Completion, FinishReason, Request
from jaxrl_sys.rollout.wire import request_from_json, request_to_json


@dataclasses.dataclass
class Group:
  """The samples of one prompt. `done[j]` is sample j's Completion once finished."""
  group_id: int
  size: int
  admitted_version: int
  done: dict[int, Completion] = dataclasses.field(default_factory=dict)

  @property
  def complete(self) -> bool:
    return len(self.done) == self.size

  def completions(self) -> list[Completion]:
    return [self.done[j] for j in range(self.size)]


class RolloutBuffer:
  """Groups in flight plus aborted partial requests waiting to be resubmitted."""

  def __init__(self, samples_per_group: int):
    self.samples_per_group = samples_per_group
    self.groups: dict[int, Group] = {}
    self.partials: list[Request] = []

  def add_group(self, group_id: int, version: int) -> None:
    if group_id in self.groups:
      raise ValueError(f"group {group_id} is already in the buffer")
    self.groups[group_id] = Group(group_id, self.samples_per_group, version)

  def record(self, completions: Iterable[Completion]) -> None:
    """Files finished samples under their groups (unknown groups are an error)."""
    for c in completions:
      if c.finish == FinishReason.ABORTED:
        self.partials.append(c.request)
        continue
      gid, j = divmod(c.request_id, self.samples_per_group)
      if gid not in self.groups:
        raise KeyError(f"completion {c.request_id} belongs to no buffered group ({gid})")
      if j in self.groups[gid].done:
        raise RuntimeError(f"request {c.request_id} completed twice (group {gid}, sample {j})")
      self.groups[gid].done[j] = c

  def complete_groups(self) -> list[Group]:
    """Complete groups, oldest (lowest id = admitted first) first."""
    return [self.groups[g] for g in sorted(self.groups) if self.groups[g].complete]

  def pop(self, group_id: int) -> Group:
    return self.groups.pop(group_id)

  def take_partials(self) -> list[Request]:
    out, self.partials = self.partials, []
    return out

  @property
  def num_samples(self) -> int:
    return sum(len(g.done) for g in self.groups.values())

  def to_json(self) -> dict[str, Any]:
    groups = []
    for g in sorted(self.groups.values(), key=lambda g: g.group_id):
      groups.append({"group_id": g.group_id, "size": g.size, "admitted_version": g.admitted_version,
                     "done": [{"j": j, "finish": c.finish.value,
                               "request": request_to_json(c.request)}
                              for j, c in sorted(g.done.items())]})
    return {"samples_per_group": self.samples_per_group, "groups": groups,
            "partials": [request_to_json(r) for r in self.partials]}

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "RolloutBuffer":
    buf = cls(int(d["samples_per_group"]))
    for g in d["groups"]:
      grp = Group(g["group_id"], g["size"], g["admitted_version"])
      for item in g["done"]:
        grp.done[item["j"]] = Completion(request_from_json(item["request"]),
                                         FinishReason(item["finish"]))
      buf.groups[grp.group_id] = grp
    buf.partials = [request_from_json(r) for r in d["partials"]]
    return buf

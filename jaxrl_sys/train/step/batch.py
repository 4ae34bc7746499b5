"""Packing completed responses into fixed-shape, right-padded training arrays.

One row per sample: `prompt + response` right-padded to the row length (`tokens`, the model
input). Position t predicts token t + 1, so the response token j (of a prompt of length Lp) is
scored at position `Lp - 1 + j`, and the last response token, only a target, needs no input
position: `Lp + Lr - 1` positions hold a whole sample. Only a window of `W` positions per row
is scored, starting at `score_start` (`Lp - 1` with a window, 0 without): `targets`,
`loss_mask`, `behav_logprobs` and `versions` are `[rows, W]`, entry j belonging to position
`score_start + j`. With `W` the response budget the trainer computes no logits at prompt
positions (`step.token_logprobs`).

Shapes come in buckets so that few programs compile: rows = groups per micro-batch x samples
per group, with the groups bucketed by `micro_batches` (a step never pays for more than a
quarter of padding groups, and compiles at most one program per power of two up to m_b); the
row length `T` is what the micro-batch's longest row needs (`row_length`), rounded up to a
multiple of `row_granule(prompt bucket)`, at most prompt bucket + response budget: at most five
lengths, and no step computes a padded column its rows do not have.

MoE policies under routing replay also pack the rollout's routes (`Request.routes`) position by
position beside the tokens: `routes [rows, T, layers, k]` and `route_mask [rows, T]`, False
where no route was recorded (padding, padding rows, the last response token, which the engine
never fed, the tokens an episode added after its last turn, and samples without routes): those
positions route live.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np


class TrainBatch(NamedTuple):
  """Arrays of one micro-batch (or a stack of them with a leading `[micro]` axis).

  Attributes:
    tokens: `[rows, T]` int32, prompt + response, right-padded with the pad id.
    targets: `[rows, W]` int32, the token predicted at position `score_start + j`.
    attention_mask: `[rows, T]` int32, 1 on real tokens (padding rows keep their first
      position so no attention row is empty).
    loss_mask: `[rows, W]` float32, 1 where the target is a response token of a sample that
      carries gradient (0 for MC-GRPO pivots and padding rows).
    behav_logprobs: `[rows, W]` float32, the rollout engine's log-probs of the targets.
    versions: `[rows, W]` int32, weight version that generated each target (-1 elsewhere).
    advantages: `[rows]` float32.
    score_start: `[rows]` int32, the position of window entry 0 (`score_start + W <= T`).
    routes: `[rows, T, layers, k]` recorded expert ids of every input position (uint8 up to 256
      experts), or None (dense, or no replay).
    route_mask: `[rows, T]` bool, the positions whose routes are recorded, or None.
  """
  tokens: np.ndarray
  targets: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray
  behav_logprobs: np.ndarray
  versions: np.ndarray
  advantages: np.ndarray
  score_start: np.ndarray
  routes: np.ndarray | None = None
  route_mask: np.ndarray | None = None


@dataclasses.dataclass
class Sample:
  """One scored response, ready to pack.

  Attributes:
    prompt: `[Lp]` int32 prompt tokens.
    tokens, logprobs, versions: `[Lr]` response tokens, behaviour log-probs, weight versions.
    advantage: the sample's advantage.
    weight: 1.0, or 0.0 to exclude it from the gradient (MC-GRPO pivot).
    routes: `[m, layers, k]` the rollout's expert ids of the first m fed positions
      (`Request.routes`; m = Lp + Lr - 1, or fewer for a multi-turn episode whose last
      observation was never fed: the positions after m route live), or None.
    mask: `[Lr]` float32 per-token loss mask, or None (all 1): a multi-turn episode's is 1 on
      the tokens the policy sampled and 0 on observations and template glue.
  """
  prompt: np.ndarray
  tokens: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  advantage: float
  weight: float = 1.0
  routes: np.ndarray | None = None
  mask: np.ndarray | None = None


def micro_batches(num_groups: int, max_groups: int, min_groups: int = 1) -> list[tuple[int, int]]:
  """Splits `num_groups` groups into micro-batches of at most `max_groups` groups.

  Each micro-batch is `(groups, padded)`: it takes `groups` groups and is packed as `padded`
  groups, a power of two at least `min_groups` (or `max_groups`), so few shapes are ever
  compiled and data parallelism can split every micro-batch evenly. A remainder is
  padded up to the next bucket when that adds at most a quarter of padding groups, and split
  into a power of two plus the rest otherwise (7 -> [(7, 8)], 5 -> [(4, 4), (1, 1)]).

  Args:
    num_groups: groups ready to train on (>= 0).
    max_groups: m_b, the largest micro-batch in groups (>= 1).
    min_groups: the smallest micro-batch in groups (e.g. the data-parallel degree divided by
      its common factor with the samples per group); capped at `max_groups`.

  Returns:
    `[(groups, padded), ...]` with `sum(groups) == num_groups` and `groups <= padded`.
  """
  if max_groups < 1:
    raise ValueError(f"max_groups must be >= 1, got {max_groups}")
  out, left = [], int(num_groups)
  while left > 0:
    if left >= max_groups:
      out.append((max_groups, max_groups))
      left -= max_groups
      continue
    bucket = min(max(1 << (left - 1).bit_length(), min_groups), max_groups)
    take = 1 << (left.bit_length() - 1)
    if 4 * (bucket - left) <= bucket or take < min_groups:
      out.append((left, bucket))
      break
    out.append((take, take))
    left -= take
  return out


def row_granule(max_prompt_len: int) -> int:
  """The step between packed row lengths: the smallest power of two at least a quarter of the
  prompt bucket (8 -> 2, 16 -> 4, 512 -> 128). With a scoring window of the response budget W
  every row length lies in `(W, max_prompt_len + W]`, so at most five lengths ever compile."""
  if max_prompt_len < 1:
    raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
  return 1 << max(-(-max_prompt_len // 4) - 1, 0).bit_length()


def row_length(samples: Sequence[Sample], seq_len: int, granule: int,
               window: int | None = None) -> int:
  """The row length `T` to pack `samples` with: the longest `prompt + response - 1` (the last
  response token is only a target) and, with a scoring window `W`, the longest `prompt - 1 + W`
  (the window must end by T), rounded up to a multiple of `granule` and capped at `seq_len` (a
  sample that does not fit is `pack`'s error)."""
  need = 1
  for s in samples:
    lp = len(s.prompt)
    need = max(need, lp, lp + len(s.tokens) - 1, lp - 1 + (0 if window is None else int(window)))
  return min(-(-need // granule) * granule, seq_len)


def pack(samples: Sequence[Sample], rows: int, seq_len: int, pad_id: int = 0,
         window: int | None = None, route_shape: tuple[int, int, Any] | None = None) -> TrainBatch:
  """Packs up to `rows` samples into one micro-batch (missing rows are padding).

  Args:
    samples: the scored responses.
    rows, seq_len: the micro-batch shape `[rows, T]`.
    pad_id: the padding token.
    window: W, scored positions per row starting at the last prompt position (at least the
      longest response); None scores every position (`score_start = 0`, `W = T`).
    route_shape: `(layers, k, dtype)` to pack the samples' routes (routing replay), or None
      (no `routes` / `route_mask`).

  Raises:
    ValueError: when there are more samples than rows, a sample does not fit `seq_len`, or
      its response does not fit the window.
  """
  if len(samples) > rows:
    raise ValueError(f"{len(samples)} samples do not fit a micro-batch of {rows} rows")
  t = seq_len
  w = t if window is None else int(window)
  tokens = np.full((rows, t), pad_id, np.int32)
  targets = np.full((rows, w), pad_id, np.int32)
  attn = np.zeros((rows, t), np.int32)
  attn[:, 0] = 1
  loss_mask = np.zeros((rows, w), np.float32)
  behav = np.zeros((rows, w), np.float32)
  versions = np.full((rows, w), -1, np.int32)
  adv = np.zeros((rows,), np.float32)
  start = np.zeros((rows,), np.int32)
  routes = route_mask = None
  if route_shape is not None:
    layers, k, dtype = route_shape
    routes = np.zeros((rows, t, layers, k), dtype)
    route_mask = np.zeros((rows, t), bool)
  for i, s in enumerate(samples):
    lp, lr = len(s.prompt), len(s.tokens)
    if max(lp, lp + lr - 1) > t:
      raise ValueError(f"sample of {lp} prompt + {lr} response tokens exceeds seq_len={t}")
    seq = np.concatenate([np.asarray(s.prompt, np.int32), np.asarray(s.tokens, np.int32)])
    n = min(lp + lr, t)  # the last response token is only a target: it needs no input position
    tokens[i, :n] = seq[:n]
    attn[i, :n] = 1
    if window is not None:
      if lr > w or lp - 1 + w > t:
        raise ValueError(f"a response of {lr} tokens after a {lp}-token prompt does not fit a "
                         f"scoring window of {w} in seq_len={t}: the window must hold the "
                         "longest response and end by seq_len")
      start[i] = lp - 1
    first = lp - 1 - start[i]           # window entry of the first response token
    nxt = seq[1 + start[i]:]            # the targets from the window's first position on
    targets[i, :min(len(nxt), w)] = nxt[:w]
    sl = slice(first, first + lr)
    loss_mask[i, sl] = float(s.weight) * (1.0 if s.mask is None else np.asarray(s.mask,
                                                                                 np.float32))
    behav[i, sl] = s.logprobs
    versions[i, sl] = s.versions
    adv[i] = s.advantage
    if routes is not None and s.routes is not None and len(s.routes):
      need = _routes_needed(s, lp, lr)
      if not need <= len(s.routes) <= lp + lr - 1 or s.routes.shape[1:] != routes.shape[2:]:
        want = (f"prompt + response - 1 = {lp + lr - 1}" if need == lp + lr - 1 else
                f"{need} (up to the last sampled token) to {lp + lr - 1}")
        raise ValueError(f"a sample's routes have shape {list(s.routes.shape)}; expected "
                         f"[{want}, {routes.shape[2]}, {routes.shape[3]}]")
      m = min(len(s.routes), t)
      routes[i, :m] = s.routes[:m]
      route_mask[i, :m] = True
  return TrainBatch(tokens, targets, attn, loss_mask, behav, versions, adv, start, routes,
                    route_mask)


def _routes_needed(s: Sample, lp: int, lr: int) -> int:
  """The fed positions whose routes a sample must record: all (`lp + lr - 1`), or with a loss
  mask (a multi-turn episode) those up to the one that produced its last sampled token."""
  if s.mask is None:
    return lp + lr - 1
  sampled = np.flatnonzero(np.asarray(s.mask) > 0)
  return 0 if not len(sampled) else lp + int(sampled[-1])


def stack(batches: Sequence[TrainBatch]) -> TrainBatch:
  """Stacks micro-batches on a new leading `[micro]` axis."""
  return TrainBatch(*(None if xs[0] is None else np.stack(xs) for xs in zip(*batches)))


def split(batch: TrainBatch, rows: int) -> TrainBatch:
  """Reshapes a flat batch `[n * rows, T]` into micro-batches `[n, rows, T]`."""
  n = batch.tokens.shape[0]
  if n % rows:
    raise ValueError(f"{n} rows do not split into micro-batches of {rows}")
  return TrainBatch(*(None if x is None else x.reshape((n // rows, rows) + x.shape[1:])
                      for x in batch))

"""Response lengths of a reasoning model: a seeded, clipped log-normal.

    length = clip(round(exp(N(log(median), sigma^2))), min_tokens, max_tokens)

Defaults (RLBoost's setup: OpenR1-Math prompts, max response 14K tokens - RLBOOST.md
1.6/1.7, 14336 in the released example): median 4,000 and sigma 0.9 give an unclipped mean of
exp(sigma^2/2) x median = 6,000 tokens, the average length of DeepSeek-R1's responses the
Open-R1 team measured (huggingface.co/blog/open-r1/update-1: "on average ... 6,000 tokens",
some over 20,000). After clipping at 14,336: mean ~5,300, median 4,000, p90 ~12,700, and
~7.8% of responses hit the cap (p95 and p99 = the cap). RLBoost does not publish its length
distribution; these figures stand in for it.

`group_share` is the share of the log-variance common to the G responses of one prompt (hard
prompts are long for every sample); the marginal distribution does not depend on it.
"""
from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

_N = NormalDist()


@dataclasses.dataclass(frozen=True)
class LengthDistribution:
  """Clipped log-normal response lengths (tokens).

  Attributes:
    median: median of the unclipped log-normal (tokens).
    sigma: standard deviation of log(length).
    max_tokens: clip above (the response budget).
    min_tokens: clip below.
    group_share: fraction of sigma^2 shared by the responses of one prompt, in [0, 1].
  """
  median: float = 4000.0
  sigma: float = 0.9
  max_tokens: int = 14336
  min_tokens: int = 1
  group_share: float = 0.0

  def __post_init__(self):
    if not (self.median > 0 and self.sigma >= 0 and 1 <= self.min_tokens <= self.max_tokens
            and 0 <= self.group_share <= 1):
      raise ValueError("LengthDistribution: need median > 0, sigma >= 0, 1 <= min_tokens <= "
                       f"max_tokens, 0 <= group_share <= 1; got {self}")

  @property
  def mu(self) -> float:
    return math.log(self.median)

  def cdf(self, x: float) -> float:
    """P(length <= x) of the clipped, unrounded distribution."""
    if x < self.min_tokens:
      return 0.0
    if x >= self.max_tokens:
      return 1.0
    if self.sigma == 0:
      return float(self.median <= x)
    return _N.cdf((math.log(x) - self.mu) / self.sigma)

  def quantile(self, q: float) -> float:
    """The q-quantile (tokens) of the clipped, unrounded distribution, 0 < q < 1."""
    if not 0 < q < 1:
      raise ValueError(f"quantile: q must be in (0, 1), got {q}")
    x = math.exp(self.mu + self.sigma * _N.inv_cdf(q))
    return float(min(max(x, self.min_tokens), self.max_tokens))

  def mean(self) -> float:
    """Mean (tokens) of the clipped, unrounded distribution (closed form)."""
    lo, hi, mu, s = self.min_tokens, self.max_tokens, self.mu, self.sigma
    if s == 0:
      return float(min(max(self.median, lo), hi))

    def z(x):
      return (math.log(x) - mu) / s

    def partial(x):  # E[X; X <= x] of the unclipped log-normal
      return math.exp(mu + s * s / 2) * _N.cdf(z(x) - s)

    return (lo * _N.cdf(z(lo)) + partial(hi) - partial(lo) + hi * (1 - _N.cdf(z(hi))))

  def cap_fraction(self) -> float:
    """Fraction of responses that reach `max_tokens`."""
    return 1.0 - self.cdf(self.max_tokens - 1e-9)

  def sample(self, rng: np.random.Generator, n: int, group_size: int = 1) -> np.ndarray:
    """`[n]` int64 lengths; consecutive blocks of `group_size` are the samples of one prompt
    (sharing `group_share` of the log-variance). Deterministic for a seeded `rng`."""
    if n < 0 or group_size < 1:
      raise ValueError(f"sample: need n >= 0 and group_size >= 1, got {n}, {group_size}")
    groups = -(-n // group_size)
    shared = rng.standard_normal(groups).repeat(group_size)[:n]
    own = rng.standard_normal(n)
    z = math.sqrt(self.group_share) * shared + math.sqrt(1 - self.group_share) * own
    x = np.rint(np.exp(self.mu + self.sigma * z))
    return np.clip(x, self.min_tokens, self.max_tokens).astype(np.int64)


REASONING_LENGTHS = LengthDistribution()


def sample_lengths(rng: np.random.Generator, n: int,
                   dist: LengthDistribution = REASONING_LENGTHS, group_size: int = 1) -> np.ndarray:
  """`[n]` response lengths (tokens) drawn from `dist` (see `LengthDistribution.sample`)."""
  return dist.sample(rng, n, group_size)

"""Prices of reserved (on-demand) and preemptible (spot) GPUs, and cost helpers.

Default: RLBoost's averages over AWS and GCP regions (paper Table 3, as summarised in
RLBOOST.md 1.7 [2nd-hand]): an on-demand 8xH100 ~$83.79/h (~$10.47/GPU-h) and a 2xH100
spot instance ~$5.32/h ($2.66/GPU-h), a ~75% spot discount.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Prices:
  """Dollars per GPU-hour.

  Attributes:
    on_demand_gpu_hour: reserved (on-demand) GPUs.
    spot_gpu_hour: preemptible (spot) GPUs.
  """
  on_demand_gpu_hour: float = 83.79 / 8
  spot_gpu_hour: float = 5.32 / 2

  def __post_init__(self):
    if not (self.on_demand_gpu_hour > 0 and self.spot_gpu_hour >= 0):
      raise ValueError(f"Prices must be positive, got {self}")

  @property
  def discount(self) -> float:
    """Spot discount: 1 - spot / on-demand."""
    return 1.0 - self.spot_gpu_hour / self.on_demand_gpu_hour

  def with_discount(self, discount: float) -> Prices:
    """The same on-demand price with spot at `(1 - discount)` of it (RLBoost's sensitivity
    sweep: break-even near a 30% discount)."""
    if not 0 <= discount <= 1:
      raise ValueError(f"discount must be in [0, 1], got {discount}")
    return Prices(self.on_demand_gpu_hour, self.on_demand_gpu_hour * (1.0 - discount))


RLBOOST_PRICES = Prices()


def reserved_cost(prices: Prices, node_hours: float, gpus_per_node: int = 8) -> float:
  """Dollars for `node_hours` of reserved nodes of `gpus_per_node` GPUs."""
  if node_hours < 0 or gpus_per_node < 1:
    raise ValueError(f"reserved_cost: need node_hours >= 0, gpus >= 1; got {node_hours}, "
                     f"{gpus_per_node}")
  return node_hours * gpus_per_node * prices.on_demand_gpu_hour


def spot_cost(prices: Prices, instance_hours: float, gpus_per_instance: int = 2) -> float:
  """Dollars for `instance_hours` of spot instances of `gpus_per_instance` GPUs."""
  if instance_hours < 0 or gpus_per_instance < 1:
    raise ValueError(f"spot_cost: need instance_hours >= 0, gpus >= 1; got {instance_hours}, "
                     f"{gpus_per_instance}")
  return instance_hours * gpus_per_instance * prices.spot_gpu_hour


def run_cost(prices: Prices, duration_s: float, reserved_nodes: int,
             spot_instance_seconds: float = 0.0, gpus_per_node: int = 8,
             gpus_per_instance: int = 2) -> float:
  """Dollars of a run: `reserved_nodes` held for `duration_s` seconds plus
  `spot_instance_seconds` of spot instance time (e.g. a trace's `live_integral`)."""
  if duration_s < 0 or reserved_nodes < 0 or spot_instance_seconds < 0:
    raise ValueError("run_cost: durations and counts must be >= 0")
  return (reserved_cost(prices, reserved_nodes * duration_s / 3600.0, gpus_per_node)
          + spot_cost(prices, spot_instance_seconds / 3600.0, gpus_per_instance))


def tokens_per_dollar(tokens: float, dollars: float) -> float:
  """Cost efficiency (RLBoost's metric: tokens trained per dollar)."""
  if dollars <= 0:
    raise ValueError(f"tokens_per_dollar: dollars must be > 0, got {dollars}")
  return tokens / dollars

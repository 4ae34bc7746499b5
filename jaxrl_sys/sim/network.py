"""Weight transfer over the frontend network, with sender NIC sharing.

RLBoost's rollout instances pull new weights point-to-point from a training node's transfer
agent (RLBOOST.md 1.4). Each instance's own link caps its rate; instances pulling from the
same training node at once share that node's frontend NIC. With `k` concurrent receivers of
equal size, all finishing together:

    time = max(bytes / receiver_rate, k * bytes / sender_rate)

e.g. Qwen3-14B (29.5 GB) to four 50 Gbps instances from one 200 Gbps node: max(4.7, 4.7) s.
"""
from __future__ import annotations

from jaxrl_sys.sim.hardware import GCP_A3, Network
from jaxrl_sys.sim.presets import ModelPreset


def transfer_time(nbytes: float, link_gbps: float, n_concurrent_receivers: int = 1,
                  sender_gbps: float | None = None, efficiency: float = 1.0) -> float:
  """Seconds to move `nbytes` to each of `n_concurrent_receivers` receivers at once.

  Args:
    nbytes: bytes per receiver.
    link_gbps: each receiver's link (Gbit/s).
    n_concurrent_receivers: receivers served by the same sender at the same time.
    sender_gbps: the sender's NIC (Gbit/s), shared by all receivers; None = not a bottleneck.
    efficiency: goodput / line rate, applied to both links (0 < efficiency <= 1).
  """
  if nbytes < 0 or not link_gbps > 0 or n_concurrent_receivers < 1:
    raise ValueError("transfer_time: need nbytes >= 0, link_gbps > 0 and at least one "
                     f"receiver; got {nbytes}, {link_gbps}, {n_concurrent_receivers}")
  if sender_gbps is not None and not sender_gbps > 0:
    raise ValueError(f"transfer_time: sender_gbps must be > 0, got {sender_gbps}")
  if not 0 < efficiency <= 1:
    raise ValueError(f"transfer_time: efficiency must be in (0, 1], got {efficiency}")
  bits = 8.0 * nbytes
  t = bits / (link_gbps * 1e9 * efficiency)
  if sender_gbps is not None:
    t = max(t, n_concurrent_receivers * bits / (sender_gbps * 1e9 * efficiency))
  return t


def weight_pull_time(preset: ModelPreset, n_concurrent_receivers: int = 1,
                     network: Network = GCP_A3) -> float:
  """Seconds for a rollout instance to pull the preset's bf16 weights from its paired training
  node while `n_concurrent_receivers` instances (itself included) pull from that node."""
  return transfer_time(preset.weight_bytes, network.receiver_gbps, n_concurrent_receivers,
                       network.sender_gbps, network.efficiency)

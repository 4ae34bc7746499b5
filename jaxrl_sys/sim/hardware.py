"""Accelerator and machine figures the simulator's cost models are derived from.

Every number carries its source (see also `sim/README.md`): a vendor datasheet, the RLBoost
paper's setup (RLBOOST.md 1.4, 1.7), a published measurement, or an assumption stated as
such. Efficiencies are fractions of the datasheet peak that real engines reach.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hardware:
  """One GPU type and the two machine shapes RLBoost uses.

  Attributes:
    name: label.
    hbm_bytes_per_s: peak HBM bandwidth of one GPU (bytes/s).
    peak_flops: dense bf16 tensor-core peak of one GPU (FLOP/s).
    gpu_mem_bytes: HBM capacity of one GPU (bytes).
    nvlink_bytes_per_s: NVLink bandwidth of one GPU, one direction (bytes/s).
    gpus_per_node: GPUs of a reserved training node.
    gpus_per_instance: GPUs of a preemptible rollout instance (= its tensor-parallel degree).
    weight_read_eff: fraction of HBM bandwidth a decode step reaches reading the weights.
    kv_read_eff: fraction of HBM bandwidth the decode attention kernels reach reading the KV.
    decode_flop_eff: fraction of peak FLOP/s of the decode matmuls once compute-bound.
    prefill_flop_eff: fraction of peak FLOP/s of prefill.
    mem_fraction: fraction of HBM the engine takes for weights + KV cache.
    allreduce_s: latency of one small tensor-parallel all-reduce (s); two per layer per step.
    engine_step_s: fixed CPU/scheduler/sampling time per decode step (s).
    prefill_call_s: fixed time of one prefill call (s).
  """
  name: str
  hbm_bytes_per_s: float
  peak_flops: float
  gpu_mem_bytes: float
  nvlink_bytes_per_s: float
  gpus_per_node: int = 8
  gpus_per_instance: int = 2
  weight_read_eff: float = 0.75
  kv_read_eff: float = 0.6
  decode_flop_eff: float = 0.5
  prefill_flop_eff: float = 0.6
  mem_fraction: float = 0.88
  allreduce_s: float = 10e-6
  engine_step_s: float = 1e-3
  prefill_call_s: float = 5e-3

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if isinstance(v, (int, float)) and not v > 0:
        raise ValueError(f"Hardware.{f.name} must be > 0, got {v}")
    for f in ("weight_read_eff", "kv_read_eff", "decode_flop_eff", "prefill_flop_eff",
              "mem_fraction"):
      if getattr(self, f) > 1:
        raise ValueError(f"Hardware.{f} is a fraction (<= 1), got {getattr(self, f)}")


# NVIDIA H100 SXM5 80GB datasheet (nvidia.com/en-us/data-center/h100, "H100 SXM" column):
# 3.35 TB/s HBM3, 989 TFLOPS dense BF16 (the 1,979 figure is with 2:4 sparsity), 80 GB,
# NVLink 900 GB/s bidirectional (450 GB/s per direction).
# weight_read_eff 0.75: vLLM batch-1 decode of Llama-3.1-8B on an A100 runs at ~77% of the
#   memory roofline (johnmusgrave.com/p/vllm-throughput-latency-sweep-on); assumed the same
#   on H100.
# kv_read_eff 0.6, decode_flop_eff 0.5, prefill_flop_eff 0.6: assumptions (paged-attention
#   decode kernels and skinny decode GEMMs reach well below peak; prefill GEMMs are large).
# mem_fraction 0.88: SGLang's static memory fraction for a 2-GPU engine is of this order
#   (assumption; the rest is activations, CUDA graphs, NCCL buffers).
# allreduce_s 10 us: NCCL small-message all-reduce latency over NVLink (assumption, order of
#   magnitude); engine_step_s 1 ms, prefill_call_s 5 ms: scheduler + sampling per step
#   (assumption).
H100 = Hardware(name="H100-SXM5-80GB", hbm_bytes_per_s=3.35e12, peak_flops=989e12,
                gpu_mem_bytes=80e9, nvlink_bytes_per_s=450e9)


@dataclasses.dataclass(frozen=True)
class Network:
  """Frontend links between reserved training nodes and preemptible rollout instances.

  Attributes:
    sender_gbps: frontend NIC of one training node (Gbit/s), shared by everything it sends.
    receiver_gbps: frontend NIC of one rollout instance (Gbit/s).
    efficiency: goodput / line rate of a transfer (1.0 = the line-rate lower bound).
    host_copy_bytes_per_s: GPU -> host-buffer copy of the new weights on a training node
      (bytes/s, the whole node together).
    sender_streams: transfers one training node serves at once; later pulls queue in arrival
      order (None: every pull starts at once and they share the NIC). RLBoost's release runs
      `num_mooncake_groups_per_sender = 4` transfer groups per sender, each serving one
      instance at a time (RLBOOST.md 1.4): four 50 Gbps receivers fill a 200 Gbps NIC.
  """
  sender_gbps: float = 200.0
  receiver_gbps: float = 50.0
  efficiency: float = 1.0
  host_copy_bytes_per_s: float = 50e9
  sender_streams: int | None = 4

  def __post_init__(self):
    if not (self.sender_gbps > 0 and self.receiver_gbps > 0 and 0 < self.efficiency <= 1
            and self.host_copy_bytes_per_s > 0
            and (self.sender_streams is None or self.sender_streams >= 1)):
      raise ValueError(f"Network: rates must be > 0, 0 < efficiency <= 1 and sender_streams "
                       f"None or >= 1, got {self}")


# RLBoost (RLBOOST.md 1.4): GCP a3-highgpu-8g (8xH100 training node) has one 200 Gbps
# frontend NIC, through which it reaches the spot instances; a3-highgpu-2g (2xH100 spot
# instance) has a 50 Gbps frontend vNIC. efficiency 1.0 gives the line-rate lower bound
# RLBOOST.md 1.4 derives (14B over 50 Gbps >= 4.7 s). host_copy 50 GB/s: assumption (8 GPUs
# copy their shards over PCIe Gen5 in parallel; host DRAM write bandwidth is the limit).
GCP_A3 = Network()

"""jaxrl_sys: JAX-native RL post-training of LLMs with elastic, preemptible rollout.

Subpackages: `models` (policy transformer, HF import), `losses` (GRPO family, MC-GRPO, VCPO),
`kernels` (Pallas kernels with XLA references), `sharding` (meshes, logical axis rules),
`rollout` (generation engine), `train` (train step, checkpoints, host loop), `tasks`
(verifiable tasks), `sim` (spot-pool simulator).
"""
__version__ = "0.1.0"

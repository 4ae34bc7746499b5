"""Which implementation runs on which backend: the one place that reads `jax.default_backend()`.

Every "auto" choice of the library goes through this module:

- `kernel_impl(kernel, impl)`: the implementation of a kernel (`KERNELS`), from `AUTO` per
  backend. The GPU choices follow the H100 measurements of issue 27 (jax 0.11.2, bf16):
  fused log-probs "xla_tokens" (token chunks, full vocabulary per chunk on the vendor GEMM;
  the Pallas kernel was 5x slower fwd+bwd than naive), flash attention "cudnn"
  (`jax.nn.dot_product_attention`: 1.36 ms fwd+bwd vs Pallas 1.75 ms; bf16/fp16 and
  head_dim <= 128 only, otherwise Pallas), decode attention "pallas", grouped matmul "pallas"
  (gmm/tgmm under a custom_vjp: 3.8 ms fwd+bwd vs `ragged_dot` 75.6 ms and 44 GiB temp).
  CPU and TPU run the plain-XLA paths (the kernels use Triton-style masked loads). On a GPU
  the table is also keyed on the CUDA compute capability (`GPU_BY_CAPABILITY`, below).
- `moe_implementation(tokens, num_experts)`: the routed-expert path of `MoEConfig(
  implementation="auto")`.
- `compute_dtype()`: the "auto" compute dtype of `train.precision` (bfloat16 on accelerators,
  float32 on CPU, where bfloat16 matmuls are emulated and slower, and on GPUs below sm80).
- `local_engine_count(...)`: engines of the embedded rollout (`rollout.setup.local`).
- `mesh_devices(size)`: the devices a mesh of `size` devices is built on (`train.recipe`).

Each function takes `backend=` (a platform name: "cpu", "gpu", "tpu"; "cuda"/"rocm" count as
"gpu") so the choice table can be tested without the hardware; None reads the default backend.
The GPU choices also take `capability=` ((major, minor) or "7.5"); None reads the default
device's `compute_capability` when `backend` is None too, and is "unknown" otherwise (a ROCm
device, or an explicit backend name): unknown means the sm80+ row.

GPU choice table (`GPU_BY_CAPABILITY`, "auto" per CUDA compute capability):

| capability | GPUs | log-probs | attention | decode attn. | grouped matmul | compute |
|---|---|---|---|---|---|---|
| >= 8.0 | A100, A10, L4, H100, H200 | xla_tokens | cudnn | pallas | pallas | bfloat16 |
| < 8.0 | T4 (7.5), V100 (7.0) | xla_tokens | xla | xla | xla_tiled | float32 |

Below sm80 there are no bfloat16 tensor cores and Triton has no bfloat16 dot, so no Pallas
(Triton) kernel is chosen, and cuDNN's fused flash attention needs sm80: attention runs XLA's.
The compute dtype there is float32, not float16: float16 training needs loss scaling, which the
library does not do. Grouped matmul runs "xla_tiled" (`ragged_dot` densifies on GPU: 44 GiB of
temp at the benchmark's MoE shape on an H100, "xla_tiled" 0.65 GiB). An explicit `impl` is
never overridden.
The module imports nothing at import time (jax is imported when a backend is first read).
"""
from __future__ import annotations

import os

# Implementations of each kernel that callers may request ("auto" picks one per backend).
KERNELS: dict[str, tuple[str, ...]] = {
    "fused_logprobs": ("pallas", "xla", "xla_tokens"),
    "flash_attention": ("pallas", "xla", "cudnn"),
    "decode_attention": ("pallas", "xla"),
    "grouped_matmul": ("pallas", "xla", "xla_tiled"),
}

# `impl="auto"` per backend. "xla" fused log-probs stream over vocabulary chunks (CPU);
# "xla" grouped matmul is `jax.lax.ragged_dot` (XLA:CPU runs it per group without densifying).
AUTO: dict[str, dict[str, str]] = {
    "cpu": {"fused_logprobs": "xla", "flash_attention": "xla", "decode_attention": "xla",
            "grouped_matmul": "xla"},
    "gpu": {"fused_logprobs": "xla_tokens", "flash_attention": "cudnn",
            "decode_attention": "pallas", "grouped_matmul": "pallas"},
    "tpu": {"fused_logprobs": "xla", "flash_attention": "xla", "decode_attention": "xla",
            "grouped_matmul": "xla"},
}
# GPUs below sm80 (T4, V100): XLA paths only (see the module docstring's table).
GPU_PRE_AMPERE = {"fused_logprobs": "xla_tokens", "flash_attention": "xla",
                  "decode_attention": "xla", "grouped_matmul": "xla_tiled"}
# The GPU rows by minimum compute capability, highest first: a device takes the first it meets.
GPU_BY_CAPABILITY: tuple[tuple[tuple[int, int], dict[str, str]], ...] = (
    ((8, 0), AUTO["gpu"]), ((0, 0), GPU_PRE_AMPERE))
# Smallest compute capability with bfloat16 tensor cores (and bf16 Triton dots, cuDNN flash).
BF16_MIN_CAPABILITY = (8, 0)
# Where a choice cannot serve the call (dtype, head size), the next one.
FALLBACK = {("flash_attention", "cudnn"): "pallas"}
# cuDNN fused attention: half-precision inputs, head_dim a multiple of 8 up to 128.
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128

# MoE on CPU: "slots" up to this many token x expert rows (decode), "segments" above
# (`models.moe_slots.DENSE_FALLBACK_ROWS` passes the same figure).
MOE_SLOTS_MAX_ROWS = 4096
# Embedded rollout: two engines on a >= 2-core CPU host when each keeps this many slots.
MIN_SLOTS_PER_LOCAL_ENGINE = 32

_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def platform(backend: str | None = None) -> str:
  """The backend's platform name ("cpu", "gpu", "tpu", ...); None: `jax.default_backend()`."""
  if backend is None:
    import jax  # pylint: disable=import-outside-toplevel
    backend = jax.default_backend()
  backend = str(backend).lower()
  return _ALIASES.get(backend, backend)


def parse_capability(capability) -> tuple[int, int] | None:
  """(major, minor) of a compute capability given as "8.6", 8.6, (8, 6) or None (unknown;
  also a string that is not "major.minor", such as a ROCm gfx name)."""
  if capability is None:
    return None
  if isinstance(capability, (tuple, list)):
    return (int(capability[0]), int(capability[1]) if len(capability) > 1 else 0)
  major, _, minor = str(capability).strip().partition(".")
  if not major.isdigit() or not (minor.isdigit() or minor == ""):
    return None
  return int(major), int(minor or 0)


def device_capability(device=None) -> tuple[int, int] | None:
  """The CUDA compute capability of `device` (default: the first device), None where the
  device has none (CPU, TPU, ROCm)."""
  if device is None:
    import jax  # pylint: disable=import-outside-toplevel
    device = jax.devices()[0]
  return parse_capability(getattr(device, "compute_capability", None))


def _capability(backend: str | None, capability) -> tuple[int, int] | None:
  if capability is not None:
    return parse_capability(capability)
  if backend is None and platform() == "gpu":
    return device_capability()
  return None


def _table(backend: str, capability: tuple[int, int] | None = None) -> dict[str, str]:
  # An unknown backend (a plugin) runs the XLA paths, as CPU does.
  if backend == "gpu" and capability is not None:
    return next(row for least, row in GPU_BY_CAPABILITY if capability >= least)
  return AUTO.get(backend, AUTO["cpu"])


def kernel_impl(kernel: str, impl: str = "auto", *, backend: str | None = None,
                dtype=None, head_dim: int | None = None, capability=None) -> str:
  """The implementation of `kernel` that runs for a requested `impl`.

  Args:
    kernel: one of `KERNELS`.
    impl: "auto" or one of `KERNELS[kernel]` (returned as it is).
    backend: platform name; None: the default backend.
    dtype: input dtype (name or numpy/jax dtype) where the choice depends on it (cuDNN
      attention needs bfloat16/float16).
    head_dim: attention head size, where the choice depends on it.
    capability: the GPU's compute capability ("7.5", (7, 5)); None: the default device's
      when `backend` is None, else unknown (the sm80+ row).

  Returns:
    One of `KERNELS[kernel]`.
  """
  if kernel not in KERNELS:
    raise ValueError(f"unknown kernel {kernel!r}; known: {sorted(KERNELS)}")
  allowed = ("auto",) + KERNELS[kernel]
  if impl not in allowed:
    raise ValueError(f"impl for {kernel} must be one of {allowed}, got {impl!r}")
  if impl != "auto":
    return impl
  name = platform(backend)
  choice = _table(name, _capability(backend, capability) if name == "gpu" else None)[kernel]
  if (kernel, choice) == ("flash_attention", "cudnn") and not cudnn_attention_ok(dtype, head_dim):
    choice = FALLBACK[(kernel, choice)]
  return choice


def cudnn_attention_ok(dtype, head_dim: int | None) -> bool:
  """Whether cuDNN fused attention serves inputs of `dtype` and `head_dim` (None: unknown, ok)."""
  if dtype is not None:
    name = getattr(dtype, "name", None) or getattr(getattr(dtype, "dtype", None), "name", None)
    if (name or str(dtype)) not in CUDNN_DTYPES:
      return False
  return head_dim is None or (head_dim % 8 == 0 and head_dim <= CUDNN_MAX_HEAD_DIM)


def uses_pallas(kernel: str, impl: str = "auto", **kw) -> bool:
  """True when `kernel_impl(kernel, impl, **kw)` is the Pallas kernel."""
  return kernel_impl(kernel, impl, **kw) == "pallas"


def pallas_interpret(backend: str | None = None) -> bool:
  """True where Pallas kernels can only run in interpret mode (CPU and unknown backends)."""
  return platform(backend) not in ("gpu",)


def moe_implementation(implementation: str, tokens: int, num_experts: int, *,
                       slots_max_rows: int = MOE_SLOTS_MAX_ROWS,
                       backend: str | None = None) -> str:
  """The routed-expert path for `MoEConfig.implementation` at `tokens` rows of `num_experts`.

  "auto": "ragged" (grouped matmul, `kernel_impl("grouped_matmul")`) off CPU; on CPU "slots"
  up to `slots_max_rows` token x expert rows (decode) and "segments" above (training and
  prefill: exact work for any routing). Any other implementation is returned as it is.
  """
  if implementation != "auto":
    return implementation
  if platform(backend) != "cpu":
    return "ragged"
  return "slots" if tokens * num_experts <= slots_max_rows else "segments"


def compute_dtype(backend: str | None = None, *, capability=None) -> str:
  """The dtype "auto" compute resolves to: "float32" on CPU (bfloat16 matmuls are emulated
  there, and slower) and on a GPU below sm80 (no bfloat16 tensor cores; float16 would need
  loss scaling, which the library does not do), "bfloat16" on other accelerators (GPU, TPU,
  a plugin). `capability` as for `kernel_impl`."""
  name = platform(backend)
  if name == "cpu":
    return "float32"
  cap = _capability(backend, capability) if name == "gpu" else None
  return "float32" if cap is not None and cap < BF16_MIN_CAPABILITY else "bfloat16"


def local_engine_count(requested: int, num_slots: int, *, backend: str | None = None,
                       cpu_count: int | None = None) -> int:
  """Engines of the embedded rollout: `requested` (capped at `num_slots`), or for 0 (auto) two
  on a CPU host with >= 2 cores when each keeps >= `MIN_SLOTS_PER_LOCAL_ENGINE` slots (one
  engine's small decode ops leave a core idle there), else one (an accelerator runs one
  engine's batch best)."""
  if requested:
    return min(requested, num_slots)
  cores = (os.cpu_count() or 1) if cpu_count is None else cpu_count
  if platform(backend) == "cpu" and cores >= 2 and num_slots >= 2 * MIN_SLOTS_PER_LOCAL_ENGINE:
    return 2
  return 1


def mesh_on_cpu(size: int, accelerators: int, cpus: int, *, backend: str | None = None) -> bool:
  """Whether a mesh of `size` devices goes on the CPU devices: the default backend is an
  accelerator with fewer than `size` devices and there are enough (fake) CPU devices."""
  return platform(backend) != "cpu" and size > accelerators and cpus >= size


def cpu_devices() -> list:
  """The CPU devices, or [] where the CPU backend is not loaded (`JAX_PLATFORMS=cuda`)."""
  import jax  # pylint: disable=import-outside-toplevel
  try:
    return list(jax.devices("cpu"))
  except RuntimeError:
    return []


def mesh_devices(size: int) -> list:
  """The devices a mesh of `size` is built on: the default backend's, or the CPU devices
  (faked by `--xla_force_host_platform_device_count`) when `mesh_on_cpu`."""
  import jax  # pylint: disable=import-outside-toplevel
  devices = jax.devices()
  if platform() != "cpu" and size > len(devices):
    cpus = cpu_devices()
    if mesh_on_cpu(size, len(devices), len(cpus)):
      return list(cpus)
  return list(devices)


def describe(backend: str | None = None, *, capability=None) -> dict[str, str]:
  """The "auto" choice of every kernel and the compute dtype on `backend` (for benchmark
  reports); on a GPU also its compute capability ("unknown" where there is none)."""
  name = platform(backend)
  if name != "gpu":
    return {"backend": name, **_table(name), "compute_dtype": compute_dtype(name)}
  cap = _capability(backend, capability)
  return {"backend": name, "capability": "unknown" if cap is None else f"{cap[0]}.{cap[1]}",
          **_table(name, cap), "compute_dtype": compute_dtype(name, capability=cap)}

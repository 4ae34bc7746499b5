"""The backend choice table (`jaxrl_sys.backend`), per backend name, without the hardware."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxrl_sys import backend

# Expected "auto" choices, written out independently of `backend.AUTO`.
EXPECTED = {
    "cpu": dict(fused_logprobs="xla", flash_attention="xla", decode_attention="xla",
                grouped_matmul="xla"),
    "gpu": dict(fused_logprobs="xla_tokens", flash_attention="cudnn", decode_attention="pallas",
                grouped_matmul="pallas"),
    "cuda": dict(fused_logprobs="xla_tokens", flash_attention="cudnn",
                 decode_attention="pallas", grouped_matmul="pallas"),
    "tpu": dict(fused_logprobs="xla", flash_attention="xla", decode_attention="xla",
                grouped_matmul="xla"),
    "some_plugin": dict(fused_logprobs="xla", flash_attention="xla", decode_attention="xla",
                        grouped_matmul="xla"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_auto_choice_per_backend(name):
  for kernel, want in EXPECTED[name].items():
    assert backend.kernel_impl(kernel, "auto", backend=name, dtype=jnp.bfloat16,
                               head_dim=64) == want, (name, kernel)
    for forced in backend.KERNELS[kernel]:    # an explicit impl is never overridden
      assert backend.kernel_impl(kernel, forced, backend=name) == forced


def test_gpu_attention_falls_back_to_pallas_where_cudnn_cannot_serve():
  pick = lambda **kw: backend.kernel_impl("flash_attention", backend="gpu", **kw)  # noqa: E731
  assert pick(dtype=jnp.float16, head_dim=128) == "cudnn"
  assert pick(dtype="bfloat16") == "cudnn"
  assert pick(dtype=jnp.float32, head_dim=64) == "pallas"
  assert pick(dtype=jnp.bfloat16, head_dim=256) == "pallas"
  assert pick(dtype=jnp.bfloat16, head_dim=60) == "pallas"
  assert backend.kernel_impl("flash_attention", backend="cpu", dtype=jnp.float32) == "xla"


def test_rejects_unknown_kernel_and_impl():
  with pytest.raises(ValueError, match="unknown kernel"):
    backend.kernel_impl("softmax")
  with pytest.raises(ValueError, match="impl for decode_attention"):
    backend.kernel_impl("decode_attention", "cudnn")


@pytest.mark.parametrize("name,tokens,want", [("cpu", 64, "slots"), ("cpu", 4096, "segments"),
                                              ("gpu", 64, "ragged"), ("tpu", 4096, "ragged")])
def test_moe_implementation(name, tokens, want):
  assert backend.moe_implementation("auto", tokens, 8, backend=name, slots_max_rows=512) == want
  assert backend.moe_implementation("dense", tokens, 8, backend=name) == "dense"


@pytest.mark.parametrize("name,cores,slots,want", [("cpu", 2, 64, 2), ("cpu", 1, 64, 1),
                                                   ("cpu", 8, 63, 1), ("gpu", 16, 512, 1)])
def test_local_engine_count(name, cores, slots, want):
  assert backend.local_engine_count(0, slots, backend=name, cpu_count=cores) == want
  assert backend.local_engine_count(3, 2, backend=name, cpu_count=cores) == 2   # capped


@pytest.mark.parametrize("name,want", [("cpu", "float32"), ("gpu", "bfloat16"),
                                       ("cuda", "bfloat16"), ("tpu", "bfloat16")])
def test_auto_compute_dtype(name, want):
  assert backend.compute_dtype(name) == want


def test_mesh_on_cpu():
  assert backend.mesh_on_cpu(4, 1, 8, backend="gpu")
  assert not backend.mesh_on_cpu(4, 1, 2, backend="gpu")      # not enough CPU devices either
  assert not backend.mesh_on_cpu(1, 1, 8, backend="gpu")
  assert not backend.mesh_on_cpu(16, 8, 16, backend="cpu")
  assert backend.mesh_devices(1) == jax.devices()              # enough: the default devices


def test_this_host_and_pallas_interpret():
  assert backend.platform() == {"cuda": "gpu"}.get(jax.default_backend(), jax.default_backend())
  assert backend.pallas_interpret() == (backend.platform() != "gpu")
  assert backend.pallas_interpret("cpu") and backend.pallas_interpret("tpu")
  assert not backend.pallas_interpret("gpu")
  assert backend.describe("gpu")["grouped_matmul"] == "pallas"


def test_import_is_cheap():
  code = "import sys, jaxrl_sys.backend; print('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_moe_config_names_the_grouped_matmul_impls():
  from jaxrl_sys.models.config import MoEConfig  # pylint: disable=import-outside-toplevel
  assert MoEConfig().grouped_matmul_impl == "auto"
  for impl in backend.KERNELS["grouped_matmul"]:
    MoEConfig(grouped_matmul_impl=impl)
  with pytest.raises(ValueError, match="grouped_matmul_impl"):
    MoEConfig(grouped_matmul_impl="triton")


# The GPU rows by compute capability, written out independently of `backend.GPU_BY_CAPABILITY`:
# below sm80 no Pallas (Triton) kernel, no cuDNN flash attention, float32 compute.
PRE_AMPERE = dict(fused_logprobs="xla_tokens", flash_attention="xla", decode_attention="xla",
                  grouped_matmul="xla_tiled")


@pytest.mark.parametrize("cap,want,dtype", [
    ("7.5", PRE_AMPERE, "float32"), ((7, 0), PRE_AMPERE, "float32"),    # T4, V100
    ("6.1", PRE_AMPERE, "float32"),
    ("8.0", EXPECTED["gpu"], "bfloat16"), ("8.6", EXPECTED["gpu"], "bfloat16"),   # A100, A10
    ("8.9", EXPECTED["gpu"], "bfloat16"), ((9, 0), EXPECTED["gpu"], "bfloat16"),  # L4, H100
    ("10.0", EXPECTED["gpu"], "bfloat16"),
    (None, EXPECTED["gpu"], "bfloat16"), ("gfx90a", EXPECTED["gpu"], "bfloat16")])  # unknown
def test_gpu_choice_by_compute_capability(cap, want, dtype):
  for kernel, impl in want.items():
    for dt in (jnp.bfloat16, jnp.float16, jnp.float32):
      got = backend.kernel_impl(kernel, backend="gpu", capability=cap, dtype=dt, head_dim=64)
      if (kernel, impl, dt) == ("flash_attention", "cudnn", jnp.float32):
        impl = "pallas"    # cuDNN takes half precision only (sm80+ fallback)
      assert got == impl, (cap, kernel, dt)
      assert "pallas" not in got or want is not PRE_AMPERE
    for forced in backend.KERNELS[kernel]:    # an explicit impl is never overridden
      assert backend.kernel_impl(kernel, forced, backend="gpu", capability=cap) == forced
  assert backend.compute_dtype("gpu", capability=cap) == dtype
  described = backend.describe("gpu", capability=cap)
  assert described["compute_dtype"] == dtype and described["flash_attention"] == (
      "xla" if want is PRE_AMPERE else "cudnn")


class _FakeDevice:
  def __init__(self, compute_capability):
    self.compute_capability = compute_capability


def test_capability_read_from_the_device(monkeypatch):
  assert backend.device_capability(_FakeDevice("7.5")) == (7, 5)
  assert backend.device_capability(object()) is None           # CPU / TPU: no capability
  assert backend.parse_capability(8.6) == (8, 6) and backend.parse_capability("9") == (9, 0)
  # The default device is read when neither backend nor capability is given.
  monkeypatch.setattr(backend, "platform", lambda b=None: "gpu")
  monkeypatch.setattr(jax, "devices", lambda *a: [_FakeDevice("7.5")])
  assert backend.kernel_impl("grouped_matmul") == "xla_tiled"
  assert backend.kernel_impl("flash_attention", dtype=jnp.bfloat16, head_dim=64) == "xla"
  assert backend.compute_dtype() == "float32"
  assert backend.describe()["capability"] == "7.5"
  monkeypatch.setattr(jax, "devices", lambda *a: [_FakeDevice("9.0")])
  assert backend.kernel_impl("grouped_matmul") == "pallas"
  assert backend.compute_dtype() == "bfloat16"

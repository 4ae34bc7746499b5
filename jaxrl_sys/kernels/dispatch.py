"""Small Pallas helpers shared by every kernel.

Which implementation runs is `jaxrl_sys.backend.kernel_impl(kernel, impl)` (the Pallas kernels
lower on GPU, through Triton; CPU and TPU run the plain-XLA paths: these kernels use
Triton-style masked loads that Mosaic does not lower). `impl="pallas"` forces the kernel; on CPU
it then runs in interpret mode (`default_interpret()`), which is how the tests exercise it.

The Pallas helpers hide API moves between jax releases: masked `load`/`store` live in
`jax.experimental.pallas.triton` from jax 0.10 on (earlier releases had `pl.load`/`pl.store`).
"""
from __future__ import annotations

import functools
from typing import Literal

from jax.experimental import pallas as pl

from jaxrl_sys import backend

try:  # jax >= 0.10: Triton-specific primitives moved out of `pl`.
  from jax.experimental.pallas import triton as _plt
  _HAS_TRITON_MODULE = True
except ImportError:  # pragma: no cover - older jax.
  _plt = None
  _HAS_TRITON_MODULE = False

Impl = Literal["auto", "pallas", "xla"]


def default_interpret() -> bool:
  """True where Pallas kernels can only run in interpret mode (CPU)."""
  return backend.pallas_interpret()


def resolve_interpret(interpret: bool | None) -> bool:
  """`interpret`, or the platform default when it is None."""
  return default_interpret() if interpret is None else bool(interpret)


def next_pow2(n: int) -> int:
  """Smallest power of two >= n (and >= 1)."""
  return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def block_size(requested: int, extent: int, minimum: int = 16) -> int:
  """A power-of-two block no larger than needed for `extent`, at least `minimum`.

  Triton needs power-of-two tensor shapes and `tl.dot` operands of at least 16 per dim.
  """
  return max(minimum, min(next_pow2(requested), next_pow2(extent)))


def load(ref, *, mask=None, other=None):
  """Masked load (Triton and interpret mode); lanes where `mask` is False read `other`."""
  if _HAS_TRITON_MODULE:
    return _plt.load(ref, mask=mask, other=other)
  idx = tuple(slice(None) for _ in ref.shape)  # pragma: no cover
  return pl.load(ref, idx, mask=mask, other=other)  # pragma: no cover


def store(ref, val, *, mask=None):
  """Masked store: lanes where `mask` is False are left untouched."""
  if _HAS_TRITON_MODULE:
    return _plt.store(ref, val.astype(ref.dtype), mask=mask)
  idx = tuple(slice(None) for _ in ref.shape)  # pragma: no cover
  return pl.store(ref, idx, val.astype(ref.dtype), mask=mask)  # pragma: no cover


@functools.lru_cache(maxsize=None)
def compiler_params(num_warps: int = 4, num_stages: int = 2):
  """Triton compiler parameters (also selects the Triton backend over Mosaic GPU)."""
  if _HAS_TRITON_MODULE:
    return _plt.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  return None  # pragma: no cover


def full_spec(shape: tuple[int, ...], squeeze: tuple[int, ...] = (), index=None) -> pl.BlockSpec:
  """BlockSpec covering whole (padded) dims, with `squeeze` dims indexed by `index(*grid)`.

  Args:
    shape: block shape per array dim; entries in `squeeze` are ignored (squeezed to one index).
    squeeze: array dims selected by the grid through `index`.
    index: function of the grid indices returning one index per dim in `squeeze`.
  """
  block = tuple(None if d in squeeze else s for d, s in enumerate(shape))

  def index_map(*grid):
    picked = iter(index(*grid)) if squeeze else iter(())
    return tuple(next(picked) if d in squeeze else 0 for d in range(len(shape)))

  return pl.BlockSpec(block, index_map)

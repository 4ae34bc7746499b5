"""Device meshes from strings such as "8x4", with errors that name the problem."""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import jax
import numpy as np

DEFAULT_AXIS_NAMES = ("data", "model")
_MESH_RE = re.compile(r"^\s*[1-9]\d*(\s*x\s*[1-9]\d*)*\s*$")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """A mesh shape with axis names, e.g. shape (8, 4) on ("data", "model")."""
  shape: tuple[int, ...]
  axis_names: tuple[str, ...] = DEFAULT_AXIS_NAMES

  @property
  def size(self) -> int:
    return int(np.prod(self.shape))

  def __str__(self) -> str:
    return "x".join(str(s) for s in self.shape)


def parse_mesh(text: str, axis_names: Sequence[str] | None = None) -> MeshSpec:
  """Parses "8x4" (or "8", "2x2x2") into a MeshSpec.

  Axis names default to ("data", "model"); a one-dimensional mesh gets ("data",), a
  three-dimensional one ("data", "model", "expert") unless names are given.

  Raises:
    ValueError: on a malformed string ("8x", "0x4", "ax4") or a name count mismatch.
  """
  if not isinstance(text, str) or not _MESH_RE.match(text):
    raise ValueError(
        f"bad mesh string {text!r}: expected positive integers separated by 'x', "
        "e.g. '8x4' (data x model) or '8'")
  shape = tuple(int(p) for p in text.replace(" ", "").split("x"))
  if axis_names is None:
    defaults = {1: ("data",), 2: DEFAULT_AXIS_NAMES, 3: ("data", "model", "expert")}
    if len(shape) not in defaults:
      raise ValueError(f"bad mesh string {text!r}: give axis names for a {len(shape)}-d mesh")
    axis_names = defaults[len(shape)]
  axis_names = tuple(axis_names)
  if len(axis_names) != len(shape):
    raise ValueError(
        f"mesh {text!r} has {len(shape)} axes but {len(axis_names)} names were given: "
        f"{axis_names}")
  if len(set(axis_names)) != len(axis_names):
    raise ValueError(f"mesh axis names must be distinct, got {axis_names}")
  return MeshSpec(shape, axis_names)


def describe_devices(devices: Sequence[jax.Device] | None = None) -> str:
  devices = list(jax.devices() if devices is None else devices)
  kinds: dict[str, int] = {}
  for d in devices:
    kinds[d.platform] = kinds.get(d.platform, 0) + 1
  return ", ".join(f"{n} {k}" for k, n in kinds.items()) or "no devices"


def make_mesh(spec: MeshSpec | str,
              devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """Builds a `jax.sharding.Mesh` (Auto axis types) for `spec` over the first `spec.size` devices.

  Raises:
    ValueError: when the mesh needs more devices than are present; the message names the
      devices present and how to fake more on CPU.
  """
  if isinstance(spec, str):
    spec = parse_mesh(spec)
  devices = list(jax.devices() if devices is None else devices)
  if spec.size > len(devices):
    raise ValueError(
        f"mesh {spec} ({'x'.join(spec.axis_names)}) needs {spec.size} devices but only "
        f"{len(devices)} are present ({describe_devices(devices)}); on CPU set "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={spec.size} before JAX starts")
  arr = np.asarray(devices[: spec.size], dtype=object).reshape(spec.shape)
  auto = getattr(jax.sharding, "AxisType", None)
  if auto is not None:
    return jax.sharding.Mesh(arr, spec.axis_names, axis_types=(auto.Auto,) * len(spec.shape))
  return jax.sharding.Mesh(arr, spec.axis_names)


def single_device_mesh(axis_names: Sequence[str] = DEFAULT_AXIS_NAMES) -> jax.sharding.Mesh:
  """A 1x1 mesh on the first device (the embedded default)."""
  return make_mesh(MeshSpec((1,) * len(axis_names), tuple(axis_names)))

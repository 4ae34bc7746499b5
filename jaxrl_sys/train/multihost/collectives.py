"""Process-group plumbing of a multi-process run (multi-controller JAX): who is process 0
(`is_main`), the barriers and collectives every process calls in the same order (`sync`,
`allgather`, `agree_any`, `run_on_main`, `share_from_main`, `gather_to_host`), and each
process's block of a mesh and of a batch (`local_mesh`, `localize`, `row_block`).

What the loop builds with them (each process its own rows of every batch) is
`train.loop.process_group`; this wing sits below the loop and imports nothing of it.
"""
from __future__ import annotations

import logging
from typing import Any

import jax
import numpy as np

from jaxrl_sys.train.step.update import batch_sharding

log = logging.getLogger(__name__)


def spans_processes(mesh: jax.sharding.Mesh) -> bool:
  """True when some of `mesh`'s devices belong to another process."""
  me = jax.process_index()
  return any(d.process_index != me for d in mesh.devices.flat)


def is_main() -> bool:
  """True on the process that writes the run's files (process 0)."""
  return jax.process_index() == 0


# gloo gives a peer 30 s to reach a collective; the processes may be further apart than that
# (process 1 compiles what process 0 loads from the persistent cache, whose keys include the
# local devices and which only process 0 writes). So every collective is preceded by a
# coordination-service barrier, which waits as long as it takes (a lost peer is the
# watchdog's: `train.multihost.job.Watchdog`), and a program is compiled before that barrier.
BARRIER_TIMEOUT_S = 3600
_barriers = [0]


def sync(name: str) -> None:
  """Waits until every process reaches this point (the coordination service's barrier; no
  device collective). Every process must call the same syncs in the same order."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  _barriers[0] += 1
  distributed.global_state.client.wait_at_barrier(f"jaxrl_sys/{_barriers[0]}/{name}",
                                                  BARRIER_TIMEOUT_S * 1000)


def compile_then_sync(name: str, fn, *args) -> None:
  """Compiles `fn(*args)` (a jitted function, or one with a `lower` like `TrainFns`'s) here,
  then `sync`s, so the call that follows starts its collectives with every peer."""
  lower = getattr(fn, "lower", None)
  if lower is not None:
    lower(*args).compile()
  sync(name)


def allgather(x: np.ndarray) -> np.ndarray:
  """`[processes, *x.shape]`: every process's `x` (same shape and dtype everywhere; a
  collective)."""
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  sync("allgather")
  return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=False))


def sum_across(row: dict, keys) -> dict:
  """`row` with its `keys` (those present on every process) summed over the processes: counts
  of work each process does for its share (tokens generated, requests migrated). A collective:
  every process calls it with the same keys."""
  present = [k for k in keys if k in row]
  if not present:
    return row
  mine = np.array([row[k] for k in present], np.int32)  # per-step counts fit
  total = allgather(mine).sum(axis=0)
  return dict(row, **{k: int(v) for k, v in zip(present, total)})


def agree_any(flag: bool) -> bool:
  """True on every process when it is True on any (a collective)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(allgather(np.array([int(bool(flag))], np.int32)).max())


def run_on_main(fn, what: str):
  """`fn()` on process 0 (ValueError shared: every process raises); the others return None.
  One process: just `fn()`."""
  if jax.process_count() == 1:
    return fn()
  out, error = None, None
  if is_main():
    try:
      out = fn()
    except ValueError as e:
      error = e
  if agree_any(error is not None):
    raise error or ValueError(f"process 0 could not {what}: see its error")
  sync(what.replace(" ", "_"))
  return out


def share_from_main(key: str, fn, timeout: float = 300.0) -> str:
  """The string `fn()` computes on process 0, on every process (through the coordination
  service's key-value store; e.g. a time-stamped run directory name)."""
  if jax.process_count() == 1:
    return fn()
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  client, name = distributed.global_state.client, f"jaxrl_sys/shared/{key}"
  if is_main():
    value = str(fn())
    client.key_value_set(name, value)
    return value
  return client.blocking_key_value_get(name, int(timeout * 1000))


def local_hook(hook, mesh: jax.sharding.Mesh):
  """A step hook `hook(step, state, row)` (e.g. `PeriodicEval`) called with the state's
  parameters and MoE state on this process's devices (`localize`), so it may run its own
  engine; every process calls it."""
  def call(step, state, row):
    params, moe, base = localize((state.params, state.moe_state, state.base), mesh)
    return hook(step, state._replace(params=params, moe_state=moe, base=base), row)
  return call


def gather_to_host(tree: Any) -> Any:
  """Every leaf as a full numpy array on every process (a collective for leaves that span
  processes; use it on all processes, then write from `is_main()` only)."""
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      sync("gather")
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(get, tree)


def local_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  """The block of `mesh` held by this process, as a mesh with the same axis names.

  Raises:
    ValueError: this process's devices do not form a block of the mesh.
  """
  devs = mesh.devices
  mine = np.vectorize(lambda d: d.process_index == jax.process_index(), otypes=[bool])(devs)
  idx = np.argwhere(mine)
  if not len(idx):
    raise ValueError(f"the mesh {dict(mesh.shape)} holds none of process "
                     f"{jax.process_index()}'s devices")
  block = tuple(slice(a, b + 1) for a, b in zip(idx.min(0), idx.max(0)))
  if not mine[block].all():
    raise ValueError(f"process {jax.process_index()}'s devices do not form a block of the "
                     f"mesh {dict(mesh.shape)}")
  types = getattr(mesh, "axis_types", None)
  if types is not None:
    return jax.sharding.Mesh(devs[block], mesh.axis_names, axis_types=types)
  return jax.sharding.Mesh(devs[block], mesh.axis_names)


def localize(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  """The leaves of `tree` as arrays on this process's devices only (what its rollout engine
  computes with). A leaf sharded only over axes held within the process (the parameters,
  replicated over the data axis) keeps its buffers (no copy, no collective); any other leaf
  is gathered (a collective: call on every process)."""
  sub = local_mesh(mesh)

  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return x
    spec = getattr(x.sharding, "spec", None)
    axes = [a for p in (spec or ()) if p is not None for a in ((p,) if isinstance(p, str) else p)]
    if spec is not None and all(sub.shape[a] == mesh.shape[a] for a in axes):
      target = jax.sharding.NamedSharding(sub, spec)
      by_dev = {s.device: s.data for s in x.addressable_shards}
      return jax.make_array_from_single_device_arrays(
          x.shape, target, [by_dev[d] for d in sub.devices.flat])
    return jax.device_put(gather_to_host(x), jax.sharding.NamedSharding(
        sub, jax.sharding.PartitionSpec()))
  return jax.tree.map(one, tree)


def row_block(mesh: jax.sharding.Mesh, rows: int, rules) -> tuple[int, int]:
  """`[start, stop)`: the rows of a `[rows, ...]` batch array this process holds.

  Raises:
    ValueError: the process's rows are not one contiguous block.
  """
  sharding = batch_sharding(mesh, (rows,), False, rules)
  got = sorted({(i[0].start or 0, rows if i[0].stop is None else i[0].stop)
                for i in sharding.addressable_devices_indices_map((rows,)).values()})
  start, stop = got[0][0], got[0][1]
  for a, b in got[1:]:
    if a > stop:
      raise ValueError(f"process {jax.process_index()} holds rows {got} of a batch of {rows}: "
                       "not one block; order the mesh devices by process")
    stop = max(stop, b)
  return start, stop

"""Finite-value checks: a host-side reward validator and a `checkify`-based checked mode.

Every loss function of this package calls `check_finite` on its inputs (at valid, unmasked
positions only: masked positions may hold garbage) and on its outputs. Those calls are no-ops
unless checks are enabled, so the default jitted code carries no checks at all. Two ways to
turn them on:

* `checked(fn)`: wraps any function of this package (or a function calling them); the wrapped
  function is jitted with `jax.experimental.checkify`, and a NaN/inf raises `NonFiniteError`
  (a `ValueError`) naming the array and the first offending index, instead of returning a NaN
  loss. Example: `checked(policy_loss)(lp, old, adv, mask, config=cfg)`.
* In a trainer's own jitted step: trace the step under `enable_checks()` inside
  `checkify.checkify(step, errors=checkify.user_checks)` and call `err.throw()` on the host.
"""
import contextlib
import contextvars
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

_ENABLED = contextvars.ContextVar("jaxrl_sys_losses_checks", default=False)


class NonFiniteError(ValueError):
  """Raised in checked mode when an input or output of a loss is NaN or infinite."""


@contextlib.contextmanager
def enable_checks():
  """Context manager: functions *traced* inside it emit `checkify` finite checks."""
  token = _ENABLED.set(True)
  try:
    yield
  finally:
    _ENABLED.reset(token)


def checks_enabled() -> bool:
  """Whether finite checks are emitted by functions traced now."""
  return _ENABLED.get()


def check_finite(x: jax.Array, name: str, valid: jax.Array | None = None) -> None:
  """Emits a `checkify.check` that `x` is finite wherever `valid` is true.

  No-op unless checks are enabled (see module docstring).

  Args:
    x: any-shape float array.
    name: name used in the error message, e.g. "policy_loss: logprobs".
    valid: optional bool array broadcastable to `x.shape`; positions where it is False are not
      checked (padding may hold anything).
  """
  if not _ENABLED.get():
    return
  x = jnp.asarray(x)
  bad = ~jnp.isfinite(x)
  if valid is not None:
    bad = bad & jnp.broadcast_to(jnp.asarray(valid, bool), x.shape)
  count = jnp.sum(bad)
  if x.ndim == 0:
    checkify.check(count == 0, f"{name} is not finite (NaN or inf)")
    return
  index = jnp.unravel_index(jnp.argmax(bad.reshape(-1)), x.shape)
  where = ", ".join(f"{{i{d}}}" for d in range(x.ndim))
  checkify.check(
      count == 0,
      f"{name} has {{count}} non-finite value(s) (NaN or inf) at valid positions; "
      f"first at index ({where}) of shape {tuple(x.shape)}",
      count=count, **{f"i{d}": i for d, i in enumerate(index)})


def _is_array(leaf: Any) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Returns a jitted, checked version of `fn` that raises on NaN/inf instead of returning NaN.

  Array leaves of the arguments are traced; every other leaf (ints, floats, strings, configs)
  is static and part of the compilation cache key.

  Args:
    fn: a function of this package, or any function calling them (not already jitted, since
      a jitted function may reuse a trace made without checks).

  Returns:
    A function with the same signature and outputs as `fn`.

  Raises:
    NonFiniteError: (from the returned function) when an input at a valid position or an
      output is NaN or infinite.
  """
  cache = {}

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    leaves, treedef = jax.tree.flatten((args, kwargs))
    dynamic = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
    static = tuple((i, leaf) for i, leaf in enumerate(leaves) if not _is_array(leaf))
    key = (treedef, static)
    if key not in cache:

      def inner(dyn_leaves):
        full = list(leaves)
        for i, leaf in zip(dynamic, dyn_leaves):
          full[i] = leaf
        a, k = jax.tree.unflatten(treedef, full)
        with enable_checks():
          return fn(*a, **k)

      cache[key] = jax.jit(checkify.checkify(inner, errors=checkify.user_checks))
    err, out = cache[key]([leaves[i] for i in dynamic])
    try:
      err.throw()
    except checkify.JaxRuntimeError as e:
      raise NonFiniteError(str(e)) from None
    return out

  return wrapper


def validate_rewards(rewards: Any, *, group_size: int | None = None) -> np.ndarray:
  """Host-side validation of a reward array before it enters a jitted step.

  Args:
    rewards: array-like of shape `[num_prompts * group]` or `[num_prompts, group]`.
    group_size: if given, the flat length must be a multiple of it.

  Returns:
    The rewards as a float NumPy array (float64 unless already floating).

  Raises:
    ValueError: wrong rank, non-numeric, not divisible by `group_size`, or NaN/inf entries
      (the message names up to 10 offending indices and their values).
  """
  arr = np.asarray(rewards)
  if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
    raise ValueError(f"rewards must be numeric, got dtype {arr.dtype}")
  if arr.ndim not in (1, 2):
    raise ValueError(f"rewards must have shape [N] or [prompts, group], got {arr.shape}")
  if not np.issubdtype(arr.dtype, np.floating):
    arr = arr.astype(np.float64)
  if group_size is not None and arr.size % group_size:
    raise ValueError(f"{arr.size} rewards are not a multiple of group_size={group_size}")
  bad = np.argwhere(~np.isfinite(arr))
  if bad.size:
    shown = [tuple(int(j) for j in i) if arr.ndim > 1 else int(i[0]) for i in bad[:10]]
    values = [arr[tuple(i)] for i in bad[:10]]
    more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
    raise ValueError(
        f"rewards contain {len(bad)} non-finite value(s) at indices {shown}{more}: "
        f"values {values}")
  return arr

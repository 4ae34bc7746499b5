"""Input checks of the losses: what raises always, what raises in checked mode.

Three kinds, from cheapest to most expensive:

* Trace-time checks always raise, under `jit` too (they read only shapes, dtypes and static
  values): wrong shapes (chex), complex or non-numeric dtypes (`TypeError`), and an external
  `denominator=` given as a Python number or a concrete array that is negative, non-finite,
  or 0 while the mask has a valid token (`LossInputError`: the loss would be 0 or NaN and
  nothing would train).
* Data checks read the values: NaN/inf at valid positions (`NonFiniteError`), a mask holding
  values other than 0 and 1, log-probabilities above 0 (probabilities passed where
  log-probabilities belong), a traced denominator that is not positive (`LossInputError`).
  They run **eagerly** whenever the arrays are concrete (a call outside `jit`: the values are
  on hand, so checking costs no tracing), and under `jit` only in **checked mode**:
* Checked mode. `checked(fn)` wraps any function of this package (or a function calling them);
  the wrapped function is jitted with `jax.experimental.checkify`, and a bad value raises
  `LossInputError` / `NonFiniteError` naming the array and the first offending index instead of
  returning a wrong loss. Example: `checked(policy_loss)(lp, old, adv, mask, config=cfg)`. In a
  trainer's own jitted step: trace the step under `enable_checks()` inside
  `checkify.checkify(step, errors=checkify.user_checks)` and call `err.throw()` on the host.
  Without either, jitted code carries no data checks at all.
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


class LossInputError(ValueError):
  """A loss input holds values it cannot mean (see the module docstring for when it is raised)."""


class NonFiniteError(LossInputError):
  """An input (at a valid position) or an output of a loss is NaN or infinite."""


# Log-probabilities are <= 0; a value above this at a valid position is taken for a probability
# (or a logit) passed by mistake. The slack covers rounding of log_softmax in low precision.
LOGPROB_TOLERANCE = 1e-3


@contextlib.contextmanager
def enable_checks():
  """Context manager: functions *traced* inside it emit `checkify` data checks."""
  token = _ENABLED.set(True)
  try:
    yield
  finally:
    _ENABLED.reset(token)


def checks_enabled() -> bool:
  """Whether data checks are emitted by functions traced now."""
  return _ENABLED.get()


def concrete(x: Any) -> np.ndarray | None:
  """`x` as a NumPy array when its value is known now (outside `jit`), else None (traced)."""
  try:
    host = np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None
  if host.dtype.kind not in "biuf":  # bfloat16 and friends (ml_dtypes): compare as float32
    try:
      host = host.astype(np.float32)
    except (TypeError, ValueError):
      return host
  return host


def _check_values(x: Any, name: str, problem: str, bad_of: Callable[[Any, Any], Any],
                  valid: Any = None, error: type = LossInputError) -> None:
  """Raises `error` (concrete `x`) or emits a checkify check (checked mode, traced `x`) that
  `bad_of(xp, x)` is False wherever `valid` is True; a no-op for a traced `x` otherwise.

  The message names `name`, the count, the first offending value and its index."""
  host, host_valid = concrete(x), None if valid is None else concrete(valid)
  if host is not None and (valid is None or host_valid is not None):
    xp, arr, v = np, host, host_valid
  elif _ENABLED.get():
    xp, arr, v = jnp, jnp.asarray(x), valid
  else:
    return
  bad = bad_of(xp, arr)
  if v is not None:
    bad = bad & xp.broadcast_to(xp.asarray(v).astype(bool), arr.shape)
  count = xp.sum(bad)
  flat = xp.argmax(bad.reshape(-1))
  value = arr.reshape(-1)[flat]
  index = {f"i{d}": i for d, i in enumerate(xp.unravel_index(flat, arr.shape))} if arr.ndim else {}
  where = (" at index (" + ", ".join(f"{{{k}}}" for k in index) + f") of shape {tuple(arr.shape)}"
           if arr.ndim else "")
  esc = lambda text: text.replace("{", "{{").replace("}", "}}")  # noqa: E731
  message = f"{esc(name)} has {{count}} {esc(problem)}; the first is {{value}}{where}"
  if xp is np:
    if count:
      raise error(message.format(count=int(count), value=value,
                                 **{k: int(i) for k, i in index.items()}))
  else:
    checkify.check(count == 0, message, count=count, value=value, **index)


def check_finite(x: jax.Array, name: str, valid: jax.Array | None = None) -> None:
  """Checks that `x` is finite wherever `valid` is true (a data check: see the module docstring).

  Args:
    x: any-shape float array.
    name: name used in the error message, e.g. "policy_loss: logprobs".
    valid: optional bool array broadcastable to `x.shape`; positions where it is False are not
      checked (padding may hold anything).

  Raises:
    NonFiniteError: (concrete `x`) a NaN or inf at a valid position.
  """
  _check_values(x, name, "non-finite value(s) (NaN or inf) at valid positions",
                lambda xp, a: ~xp.isfinite(a), valid, NonFiniteError)


def check_mask(mask: jax.Array, name: str) -> None:
  """Checks that a non-bool mask holds only 0 and 1 (a data check: see the module docstring)."""
  if jnp.result_type(mask) == jnp.bool_:
    return
  _check_values(mask, name, "value(s) other than 0 and 1 (a mask is bool or {0, 1}: weigh tokens "
                "through the advantages, not the mask)", lambda xp, m: (m != 0) & (m != 1))


def check_logprobs(x: jax.Array, name: str, valid: jax.Array | None = None) -> None:
  """Checks that log-probabilities are <= 0 (up to `LOGPROB_TOLERANCE`) at valid positions (a
  data check: see the module docstring)."""
  _check_values(x, name, "value(s) above 0 at valid positions (log-probabilities are <= 0: were "
                "probabilities or logits passed?)", lambda xp, a: a > LOGPROB_TOLERANCE, valid)


def check_dtype(x: Any, name: str, *, allow_bool: bool = True) -> None:
  """Trace-time check that `x` holds real numbers (raises under `jit` too).

  Raises:
    TypeError: a complex, non-numeric, or (unless `allow_bool`) bool dtype.
  """
  dtype = np.dtype(getattr(x, "dtype", None) or np.asarray(x).dtype)
  if jnp.issubdtype(dtype, jnp.complexfloating):
    raise TypeError(f"{name} is complex ({dtype}); losses need real values (take .real, or "
                    "fix what produced them)")
  if dtype == np.bool_ and allow_bool:
    return
  if not (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)):
    raise TypeError(f"{name} has dtype {dtype}; expected real numbers")


def check_denominator(denominator: Any, valid: jax.Array) -> None:
  """Checks an external loss denominator: finite, >= 0, and > 0 if `valid` has a True entry.

  A static (Python number) or concrete denominator is checked at once, under `jit` too; a traced
  one only in checked mode (see the module docstring).

  Raises:
    LossInputError: a bad static or concrete denominator.
  """
  fix = ("pass the number of tokens or rows the loss is averaged over, e.g. "
         "loss_denominator(mask_of_the_whole_batch, mode)")
  d = concrete(denominator)
  if d is not None:
    d = float(d)
    if not np.isfinite(d) or d < 0:
      raise LossInputError(f"denominator={d} must be finite and >= 0; {fix}")
    if d > 0:
      return
    host_valid = concrete(valid)
    if host_valid is not None:
      if host_valid.any():
        raise LossInputError(
            f"denominator=0 while the mask holds {int(host_valid.sum())} valid token(s): a "
            f"loss divided by 0 is set to 0, so nothing would train; {fix}")
      return
  if _ENABLED.get():
    den = jnp.asarray(denominator)
    checkify.check(jnp.isfinite(den) & ((den > 0) | ((den == 0) & ~jnp.any(valid))),
                   "denominator={den} must be finite, >= 0, and > 0 while the mask has a valid "
                   f"token; {fix}", den=den)


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
    LossInputError: (from the returned function) any other failed data check (mask values,
      log-probabilities above 0, a denominator that is not positive).
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
      text = str(e)
      raise (NonFiniteError if "non-finite" in text else LossInputError)(text) from None
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
  if np.issubdtype(arr.dtype, np.complexfloating) or not (
      np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
    raise ValueError(f"rewards must be real numeric values, got dtype {arr.dtype}")
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

"""Helpers shared by the kernel tests."""
import jax
import jax.numpy as jnp
import numpy as np

from tests.precision_helpers import float32_tolerance

# Interpret-mode kernels become large while-loop programs; at test sizes XLA's backend
# optimisations cost more compile time (2-3x) than they save at run time.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def jit(fun, **kwargs):
  """`jax.jit` with fast (unoptimised) XLA compilation."""
  return jax.jit(fun, compiler_options=FAST_COMPILE, **kwargs)


def assert_close(actual, expected, dtype=jnp.float32, scale=1.0):
  """Leaf-wise closeness. fp32: `float32_tolerance()` (1e-5 at full matmul precision; atol
  relative to the magnitude `scale`); bf16: 2e-2."""
  tol = float32_tolerance() if jnp.dtype(dtype) == jnp.float32 else 2e-2
  actual, expected = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(actual) == len(expected), (len(actual), len(expected))
  for a, e in zip(actual, expected):
    a = np.asarray(jnp.asarray(a, jnp.float32))
    e = np.asarray(jnp.asarray(e, jnp.float32))
    assert a.shape == e.shape, (a.shape, e.shape)
    np.testing.assert_allclose(a, e, atol=tol * scale, rtol=tol)

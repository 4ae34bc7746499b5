"""Decode attention building blocks against a numpy softmax over explicit key lists."""
import jax
import numpy as np

from jaxrl_sys.models.layers import merge_new_token, single_query_attention


def numpy_attention(q, keys, values, scale):
  """q [hq, d]; keys/values [n, hkv, d] -> [hq, d] (zeros when n == 0)."""
  hq, d = q.shape
  if keys.shape[0] == 0:
    return np.zeros((hq, d), np.float32)
  group = hq // keys.shape[1]
  out = np.zeros((hq, d), np.float64)
  for h in range(hq):
    s = keys[:, h // group].astype(np.float64) @ q[h] * scale
    p = np.exp(s - s.max())
    out[h] = (p / p.sum()) @ values[:, h // group]
  return out.astype(np.float32)


def test_cache_attention_plus_new_token_equals_softmax_over_both():
  rng = np.random.default_rng(0)
  b, s, hq, hkv, d, scale = 4, 9, 6, 2, 8, 0.35
  q = rng.normal(size=(b, hq, d)).astype(np.float32)
  k, v = (rng.normal(size=(b, s, hkv, d)).astype(np.float32) for _ in range(2))
  kn, vn = (rng.normal(size=(b, hkv, d)).astype(np.float32) for _ in range(2))
  valid = rng.random((b, s)) < 0.6
  valid[2] = False                       # a row whose cache holds nothing valid yet
  new_valid = np.array([True, False, False, True])   # row 2: nothing visible at all
  out, lse = jax.jit(lambda *a: single_query_attention(*a, scale, return_lse=True))(
      q, k, v, valid)
  merged = np.asarray(jax.jit(lambda *a: merge_new_token(*a, scale))(out, lse, q, kn, vn,
                                                                     new_valid))
  for r in range(b):
    keys, values = k[r][valid[r]], v[r][valid[r]]
    if new_valid[r]:
      keys = np.concatenate([keys, kn[r][None]])
      values = np.concatenate([values, vn[r][None]])
    np.testing.assert_allclose(merged[r], numpy_attention(q[r], keys, values, scale),
                               rtol=1e-5, atol=1e-6)
  assert np.all(merged[2] == 0.0)


def test_token_matmul_equals_einsum_in_values_and_grads():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.models.layers import token_matmul  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(1)
  x = rng.normal(size=(3, 5, 4, 6)).astype(np.float32)        # [b, t, heads, head_dim]
  w = rng.normal(size=(4, 6, 7)).astype(np.float32)           # [heads, head_dim, d]
  ref = np.einsum("bthk,hkd->btd", x.astype(np.float64), w)
  np.testing.assert_allclose(token_matmul(x, w, contract=2), ref, rtol=1e-5, atol=1e-5)
  w1 = rng.normal(size=(6, 2, 3)).astype(np.float32)          # [d, heads, head_dim]
  np.testing.assert_allclose(token_matmul(x, w1), np.einsum("bthd,dgk->bthgk", x, w1),
                             rtol=1e-5, atol=1e-5)
  loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
  got = jax.grad(loss(lambda x, w: token_matmul(x, w, contract=2)), argnums=(0, 1))(x, w)
  want = jax.grad(loss(lambda x, w: jnp.einsum("bthk,hkd->btd", x, w)), argnums=(0, 1))(x, w)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_swiglu_custom_vjp_equals_autodiff():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.models.layers import swiglu  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(2)
  g, u, dh = (rng.normal(size=(7, 9)).astype(np.float32) * 3 for _ in range(3))
  ref = lambda g, u: jax.nn.silu(g) * u  # noqa: E731
  np.testing.assert_allclose(swiglu(g, u), ref(g, u), rtol=1e-6)
  got = jax.vjp(swiglu, g, u)[1](dh)
  want = jax.vjp(ref, g, u)[1](dh)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert jnp.all(jnp.isfinite(jnp.asarray(jax.grad(lambda g: swiglu(g, 1.0))(-100.0))))

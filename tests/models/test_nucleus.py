"""Nucleus (top-p) filtering through a top-k prefilter equals a full-sort numpy reference, on
rows where the candidates hold the nucleus and on rows that need the full-sort fallback."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys.models.sampling import filter_logits


def np_nucleus_keep(logits, top_k, top_p):
  """float64: the kept set of each row (top-k first, ties at the k-th kept, then the smallest
  prefix by probability whose mass before it is < top_p)."""
  out = []
  for row in np.asarray(logits, np.float64):
    if 0 < top_k < row.size:
      row = np.where(row < np.sort(row)[::-1][top_k - 1], -np.inf, row)
    p = np.exp(row - row.max())
    p /= p.sum()
    order = np.argsort(-row, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    cutoff = row[order][before < top_p].min()
    out.append(row >= cutoff)
  return np.stack(out)


@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (40, 0.95)])
def test_prefilter_matches_full_sort(top_k, top_p):
  vocab = 3000
  key = jax.random.PRNGKey(0)
  peaked = jax.random.normal(key, (3, vocab)) * 6.0       # nucleus inside 64 candidates
  flat = jax.random.normal(jax.random.fold_in(key, 1), (3, vocab)) * 0.1   # needs the fallback
  fn = jax.jit(filter_logits, static_argnums=(1, 2, 3))
  for logits in (peaked, jnp.concatenate([peaked[:1], flat[1:]])):
    want = np_nucleus_keep(logits, top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(np.asarray(fn(logits, top_k, top_p, 64))), want)
    np.testing.assert_array_equal(np.isfinite(np.asarray(fn(logits, top_k, top_p, 0))), want)


def test_prefilter_takes_the_candidates_when_they_suffice():
  """The peaked rows' nucleus is at most a few tokens: no sort is needed (the cond's first
  branch), and the kept logits are left untouched."""
  logits = jnp.array([[10.0, 9.0, 0.0, -1.0] + [-5.0] * 96])
  got = np.asarray(filter_logits(logits, 0, 0.9, 8))
  assert np.isfinite(got).sum() == 2 and got[0, 0] == 10.0 and got[0, 1] == 9.0

"""The expert-major slot path (CPU default at decode sizes) against the dense all-experts einsum,
in values and gradients, on routings that fit the slots and on routings that overflow them (the
doubled slots, then the exact fallbacks), at training and at decode sizes."""
import numpy as np
import pytest

import jax

from jaxrl_sys.models import moe, moe_slots
from tests.models.test_moe_blocked import _routing, assert_matches_dense


def _load(experts, active, e):
  return np.bincount(np.asarray(experts)[np.asarray(active)], minlength=e)


@pytest.mark.parametrize("n,e,k,skew,drop,path", [
    (24, 4, 2, 0.0, 0, "slots"),       # balanced: the slot path
    (37, 4, 2, 0.0, 3, "slots"),       # ragged count, inactive assignments
    (5, 8, 1, 0.0, 0, "slots"),        # fewer tokens than experts
    (64, 8, 2, 0.3, 0, "double"),      # overflows 24 slots, fits 48 (decode size)
    (64, 8, 2, 1.0, 0, "dense"),       # overflows 48 slots too: dense fallback (decode size)
    (600, 8, 2, 3.0, 0, "segments"),   # skewed: overflow, segments fallback (training size)
])
def test_slots_equal_dense_values_and_grads(n, e, k, skew, drop, path):
  experts, gates, active = _routing(n, e, k, seed=0 if n == 64 else n, skew=skew,
                                    drop_every=drop)
  cap = min(moe_slots.slot_capacity(n * k, e), n)          # 5 tokens: 5 slots, not 8
  load = _load(experts, active, e).max()
  assert (load > cap) == (path != "slots")
  assert (load > 2 * cap) == (path == "dense") or path == "segments"
  assert (n * e > moe_slots.DENSE_FALLBACK_ROWS) == (path == "segments")
  assert_matches_dense(lambda p, x, g: moe_slots.slot_experts(p, x, experts, g, active),
                       e, n, experts, gates, active)


def test_layout_fills_each_experts_slots_in_token_order():
  n, e, k, cap = 30, 4, 2, 16
  experts, _, active = _routing(n, e, k, seed=3, skew=2.0, drop_every=4)
  slot, owner, load = jax.device_get(moe_slots.slot_layout(experts, active, e, cap))
  flat_e, flat_a = np.asarray(experts).reshape(-1), np.asarray(active).reshape(-1)
  np.testing.assert_array_equal(load, np.bincount(flat_e[flat_a], minlength=e))
  for ex in range(e):
    mine = np.flatnonzero(flat_a & (flat_e == ex))          # this expert's assignments, in order
    kept = mine[:cap]
    np.testing.assert_array_equal(slot[kept], ex * cap + np.arange(len(kept)))
    assert (slot[mine[cap:]] == e * cap).all()              # over capacity: no slot
    np.testing.assert_array_equal(owner[ex * cap:ex * cap + len(kept)], kept)
    assert (owner[ex * cap + len(kept):(ex + 1) * cap] == n * k).all()
  assert (slot[~flat_a] == e * cap).all()


def test_slot_capacity_is_a_multiple_of_8_above_the_balanced_load():
  assert moe_slots.slot_capacity(5120, 8) == 960          # 1.5 x 640
  assert moe_slots.slot_capacity(128, 8) == 24
  assert moe_slots.slot_capacity(4, 8) == 8
  assert moe.resolve_implementation("auto", 64, 8) == "slots"    # the tests run on CPU

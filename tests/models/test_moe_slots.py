"""The expert-major slot path (CPU default at decode sizes) against the dense all-experts einsum,
in values and gradients, on routings that fit the slots and on routings that overflow them (the
slot tiers, then the exact fallbacks), at training and at decode sizes."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys.models.moe import block as moe
from jaxrl_sys.models.moe import slots as moe_slots
from tests.models.test_moe_blocked import _experts, _routing, assert_matches_dense
from tests.precision_helpers import per_backend


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
  assert moe.resolve_implementation("auto", 64, 8) == per_backend(cpu="slots", gpu="ragged")


def test_decode_tiers_run_from_the_capacity_to_three_quarters_of_the_tokens():
  assert moe_slots.slot_tiers(64, 8, 24) == (24, 32, 40, 48)
  assert moe_slots.slot_tiers(512, 8, 192) == (192, 256, 320, 384)   # a prefill: 4 tiers
  assert moe_slots.slot_tiers(100, 8, 40) == (40, 56, 72, 75)   # equal steps, then the top
  assert moe_slots.slot_tiers(5, 8, 5) == (5,)
  assert moe_slots.slot_tiers(2560, 8, 960) == ()                 # training size: no tiers


@pytest.mark.parametrize("max_load", [24, 25, 32, 33, 41, 48, 49, 64])
def test_every_decode_tier_and_the_dense_branch_equal_a_numpy_reference(max_load):
  # 64 tokens, 8 experts, top-2: expert 0 takes the first `max_load` tokens, every other
  # assignment lands on experts 1..7 (so expert 0 holds the largest load, <= 2 * 64 / 7 < 24
  # for the others), one routing per tier boundary and past the last tier (dense).
  n, e, k, d = 64, 8, 2, 16
  rng = np.random.default_rng(max_load)
  experts = np.stack([np.where(np.arange(n) < max_load, 0, 1 + np.arange(n) % 7),
                      1 + (np.arange(n) + 3) % 7], axis=1).astype(np.int32)
  assert np.bincount(experts.ravel(), minlength=e).max() == max_load
  gates = rng.uniform(0.1, 1.0, (n, k)).astype(np.float32)
  active = np.ones((n, k), bool)
  active[5, 1] = False                                        # an inactive assignment
  p = jax.device_get(_experts(e))
  x = rng.standard_normal((n, d)).astype(np.float32)
  got = jax.jit(lambda p, x: moe_slots.slot_experts(p, x, jnp.asarray(experts),
                                                    jnp.asarray(gates), jnp.asarray(active)))(p, x)
  want = np.zeros((n, d), np.float64)
  for t in range(n):
    for j in range(k):
      if active[t, j]:
        w = {name: np.asarray(p[name][experts[t, j]], np.float64) for name in p}
        g, u = x[t] @ w["w_gate"], x[t] @ w["w_up"]
        want[t] += gates[t, j] * ((g / (1 + np.exp(-g)) * u) @ w["w_down"])
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-4)

"""The precision policy: a bfloat16 checkpoint trains float32 masters (one step against a
float64 numpy AdamW), the policy resolves per backend, and the step's mismatch statistics."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxrl_sys.losses.mismatch import mismatch_stats
from jaxrl_sys.models import load_hf_checkpoint
from jaxrl_sys.sharding import make_mesh
from jaxrl_sys.train.precision import PrecisionConfig
from jaxrl_sys.train.recipe.presets import load_model
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import OptimConfig, train_config_for_algo
from jaxrl_sys.train.step.optim import make_optimizer
from jaxrl_sys.train.step.state import abstract_state, init_train_state
from jaxrl_sys.train.step.update import make_train_fns
from tests.precision_helpers import per_backend
from tests.train.common import bf16_hf_dir

ROWS, SEQ = 64, 12
LR = 1e-6


def test_policy_resolves_per_backend_and_names_bad_values():
  cpu, gpu = PrecisionConfig().resolve("cpu"), PrecisionConfig().resolve("gpu")
  assert (cpu.param_dtype, cpu.compute_dtype, cpu.rollout_dtype) == ("float32",) * 3
  assert (gpu.param_dtype, gpu.compute_dtype, gpu.rollout_dtype) == (
      "float32", "bfloat16", "bfloat16")
  mixed = PrecisionConfig(rollout_dtype="bfloat16").resolve("cpu")
  assert (mixed.compute_dtype, mixed.rollout_dtype) == ("float32", "bfloat16")
  assert "masters + moments float32" in mixed.describe() and "rollout bfloat16" in mixed.describe()
  with pytest.raises(ValueError, match="precision.compute_dtype='float16'"):
    PrecisionConfig(compute_dtype="float16")
  with pytest.raises(ValueError, match="accum_dtype"):
    PrecisionConfig(accum_dtype="bfloat16")
  with pytest.raises(ValueError, match="resolve"):
    PrecisionConfig().train_model(load_model("tiny").config)


def test_mismatch_stats_match_numpy():
  rng = np.random.default_rng(0)
  train = -3 * rng.random((4, 7))
  roll = train + rng.normal(0, 0.6, (4, 7))
  mask = rng.random((4, 7)) < 0.7
  got = jax.tree.map(float, mismatch_stats(jnp.asarray(train, jnp.float32),
                                           jnp.asarray(roll, jnp.float32), jnp.asarray(mask)))
  d = np.abs(train - roll)[mask]
  ratio = np.exp((train - roll)[mask])
  np.testing.assert_allclose(got["mismatch_mean"], d.mean(), rtol=1e-5)
  np.testing.assert_allclose(got["mismatch_max"], d.max(), rtol=1e-5)
  np.testing.assert_allclose(got["mismatch_out_frac"], np.mean((ratio < 0.5) | (ratio > 2)))
  empty = mismatch_stats(jnp.zeros((2, 3)), jnp.ones((2, 3)), jnp.zeros((2, 3), bool))
  assert all(float(v) == 0 for v in empty.values())


def _samples(n, vocab, seed=0):
  """Responses of 1-4 tokens with advantages of both signs (a reward with signal)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    lr = int(rng.integers(1, 5))
    out.append(batch_lib.Sample(
        prompt=np.concatenate([[1], rng.integers(3, vocab, 4)]).astype(np.int32),
        tokens=rng.integers(3, vocab, lr).astype(np.int32),
        logprobs=(-3.0 * rng.random(lr)).astype(np.float32),
        versions=np.zeros(lr, np.int32), advantage=float(rng.normal()), weight=1.0))
  return out


def _adamw64(params, grads, opt: OptimConfig):
  """One float64 AdamW step (count 1) after global-norm clipping: (params, mu, nu)."""
  leaves = jax.tree.leaves(grads)
  norm = np.sqrt(sum(np.sum(g ** 2) for g in leaves))
  scale = min(1.0, opt.grad_clip / norm)
  g = jax.tree.map(lambda x: x * scale, grads)
  mu = jax.tree.map(lambda x: (1 - opt.b1) * x, g)
  nu = jax.tree.map(lambda x: (1 - opt.b2) * x * x, g)
  upd = jax.tree.map(lambda m, v: -opt.learning_rate * (m / (1 - opt.b1)) / (
      np.sqrt(v / (1 - opt.b2)) + opt.eps), mu, nu)
  return jax.tree.map(lambda p, u: p * (1 - opt.learning_rate * opt.weight_decay) + u,
                      params, upd), mu, nu


def _host64(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def test_bf16_checkpoint_step_updates_fp32_masters_like_float64_adamw(tmp_path):
  """bfloat16 checkpoint -> float32 masters; bfloat16 compute; lr 1e-6. The update equals a
  float64 AdamW step on the same gradient to float32 rounding, and every element whose
  gradient clears Adam's epsilon moves (bfloat16 masters would have kept almost all of them)."""
  d = bf16_hf_dir(tmp_path / "m")
  model = load_model(d, max_seq_len=SEQ)
  assert model.source_dtype == "bfloat16"
  _, stored = load_hf_checkpoint(d, dtype=None)  # the checkpoint's own bfloat16 values
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(stored))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b, np.float32)),
               jax.tree.map(np.asarray, model.params), stored)

  policy = PrecisionConfig(compute_dtype="bfloat16").resolve("cpu")
  mc = policy.train_model(model.config)
  opt_cfg = OptimConfig(learning_rate=LR)
  tc = train_config_for_algo("grpo", kl_coef=0.0, optim=opt_cfg)
  opt = make_optimizer(opt_cfg, moment_dtype=policy.param_dtype)
  mesh = make_mesh("1x1")
  fns = make_train_fns(mc, tc, opt, abstract_state(mc, tc, opt), mesh, donate=False)
  state = init_train_state(mc, tc, opt, mesh=mesh, params=model.params)
  assert {str(x.dtype) for x in jax.tree.leaves((state.params, state.opt_state))
          if jnp.issubdtype(x.dtype, jnp.floating)} == {"float32"}

  mb = fns.put_batch(batch_lib.pack(_samples(40, mc.vocab_size), ROWS, SEQ))
  acc = fns.accumulate(state, fns.init_accum(state, mb), mb)
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(acc.grads))
  grads = jax.tree.map(lambda g: g / float(acc.denominator), _host64(acc.grads))
  new, _ = fns.apply(state, acc)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(new.params))

  p0 = _host64(state.params)
  want, mu, nu = _adamw64(p0, grads, opt_cfg)
  got = _host64(new.params)
  for path, g, w, x, p in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads),
                              jax.tree.leaves(want), jax.tree.leaves(got), jax.tree.leaves(p0)):
    name = jax.tree_util.keystr(path[0])
    # float32 rounding: of the new master, plus a few float32 ulps of the update itself
    ulp = lambda a: np.spacing(np.abs(a).astype(np.float32)).astype(np.float64)  # noqa: E731
    assert np.all(np.abs(x - w) <= ulp(w) + 8 * ulp(w - p)), name
    live = np.abs(g) > opt_cfg.eps
    assert live.mean() > 0.5, name
    assert np.all(x[live] != p[live]), name  # every master with a real gradient moved
    bf16 = lambda a: np.asarray(a, jnp.bfloat16).astype(np.float64)  # noqa: E731
    assert np.mean(bf16(w)[live] != bf16(p)[live]) < 0.1, name  # what bf16 masters would keep
  # The moments: float32, equal to the float64 ones to float32 rounding.
  adam = new.opt_state[1][0]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=2e-6, atol=0),
               adam.mu, mu)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=2e-6, atol=1e-30),
               adam.nu, nu)


def test_recipe_resolves_the_policy_and_wires_the_behaviour_cap():
  """"auto" resolves for the backend (float32 on a CPU) and is recorded resolved (config.json)
  and in the checkpoint identity; --behav_weight_cap turns on the truncated behaviour weight in
  sync mode."""
  from jaxrl_sys.train.recipe import build as recipe_lib  # pylint: disable=import-outside-toplevel
  from tests.train.common import quick  # pylint: disable=import-outside-toplevel
  plain = recipe_lib.build_recipe(quick(compute_dtype="auto", rollout_dtype="auto"))
  auto = per_backend(cpu="float32", gpu="bfloat16")
  assert (plain.config.precision.compute_dtype, plain.config.precision.rollout_dtype) == (
      auto, auto)
  assert plain.model.config.param_dtype == "float32" and not plain.train.loss.decoupled
  capped = recipe_lib.build_recipe(quick(rollout_dtype="bfloat16", behav_weight_cap=2.0))
  loss = capped.train.loss
  assert (loss.decoupled, loss.behav_weight_cap, loss.behav_weight_cap_mode) == (
      True, 2.0, "clamp")
  ident = capped.checkpoint.identity
  assert (ident["param_dtype"], ident["compute_dtype"], ident["rollout_dtype"],
          ident["behav_weight_cap"]) == ("float32", "float32", "bfloat16", 2.0)
  assert capped.config.precision.rollout_model(capped.model.config).compute_dtype == "bfloat16"
  with pytest.raises(ValueError, match="rollout_dtype='fp8'"):
    recipe_lib.build_recipe(quick(rollout_dtype="fp8"))

"""The jitted train step: global normalisation across micro-batches, the scan step, VCPO, MoE."""

import jax
import numpy as np

from jaxrl_sys.sharding import make_mesh
from jaxrl_sys.train.step import batch as batch_lib
from jaxrl_sys.train.step.config import train_config_for_algo
from jaxrl_sys.train.step.optim import make_optimizer
from jaxrl_sys.train.recipe.presets import load_model
from jaxrl_sys.train.step.state import abstract_state, init_train_state
from jaxrl_sys.train.step.update import make_train_fns

ROWS, SEQ = 64, 12  # the loop tests' micro-batch shape (shared compiled programs)


def _samples(n, seed=0, vocab=23):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    lr = int(rng.integers(1, 5))
    out.append(batch_lib.Sample(
        prompt=np.concatenate([[1], rng.integers(3, vocab, 4)]).astype(np.int32),
        tokens=rng.integers(3, vocab, lr).astype(np.int32),
        logprobs=(-3.0 * rng.random(lr)).astype(np.float32),
        versions=np.zeros(lr, np.int32), advantage=float(rng.normal()),
        weight=float(i % 5 != 0)))  # a few excluded rows (like MC-GRPO pivots)
  return out


def _setup(model="tiny", algo="grpo", **kw):
  mc = load_model(model, max_seq_len=SEQ).config
  tc = train_config_for_algo(algo, **kw)
  opt = make_optimizer(tc.optim, ess_rule=tc.ess_rule, base_ess_ratio=tc.base_ess_ratio)
  mesh = make_mesh("1x1")
  fns = make_train_fns(mc, tc, opt, abstract_state(mc, tc, opt), mesh, donate=False)
  return mc, tc, opt, mesh, fns


def _host(tree):
  return jax.tree.map(np.asarray, tree)


_METRICS = ("loss", "kl", "entropy", "grad_norm", "num_tokens", "denominator", "ess")


def _assert_same_update(a, ma, b, mb, metric_atol=1e-9):
  """Two steps' new parameters and metrics agree (float reassociation tolerance)."""
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=5e-6),
               _host(a.params), _host(b.params))
  for k in _METRICS:
    np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=metric_atol, err_msg=k)


def test_micro_batch_split_is_globally_normalised():
  """One micro-batch of 40 samples == two of 20 == the scan step over both (same update)."""
  mc, tc, opt, mesh, fns = _setup()
  samples = _samples(40)
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)

  def run(groups):
    mbs = [fns.put_batch(batch_lib.pack(g, ROWS, SEQ)) for g in groups]
    acc = fns.init_accum(state, mbs[0])
    for mb in mbs:
      acc = fns.accumulate(state, acc, mb)
    return fns.apply(state, acc)

  one, m1 = run([samples])
  two, m2 = run([samples[:20], samples[20:]])
  stacked = batch_lib.stack([batch_lib.pack(samples[:20], ROWS, SEQ),
                             batch_lib.pack(samples[20:], ROWS, SEQ)])
  scan, m3 = fns.step(state, fns.put_batch(stacked))
  for other, m in ((two, m2), (scan, m3)):
    # Adam's first update is ~lr * sign(g): allow fp noise of 0.5% of a step (lr = 1e-3).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=5e-6),
                 _host(one.params), _host(other.params))
    for k in ("loss", "kl", "entropy", "grad_norm", "num_tokens", "denominator"):
      np.testing.assert_allclose(m1[k], m[k], rtol=1e-5, err_msg=k)
  assert int(one.step) == 1 and float(m1["num_sequences"]) == 32  # 8 rows excluded


def test_vcpo_ess_scaling_and_moe_balancing_state():
  """VCPO scales the update by sqrt(ESS / B); the MoE aux-free biases move every step."""
  mc, tc, opt, mesh, fns = _setup("tiny_moe", "vcpo")
  assert tc.ess_lr_scaling and mc.moe is not None and mc.moe.balancing == "aux_free"
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)
  assert state.ref_params is None  # no KL: no reference copy
  bias0 = np.asarray(state.moe_state.bias)
  mb = fns.put_batch(batch_lib.pack(_samples(32, seed=1), ROWS, SEQ))
  acc = fns.accumulate(state, fns.init_accum(state, mb), mb)
  new, m = fns.apply(state, acc)
  nseq = float(m["num_sequences"])
  assert 1.0 <= float(m["ess"]) < nseq  # random behaviour log-probs: few dominant weights
  np.testing.assert_allclose(float(m["lr_scale"]), np.sqrt(float(m["ess"]) / nseq), rtol=1e-5)
  assert not np.array_equal(np.asarray(new.moe_state.bias), bias0)
  assert "moe/avg_maxvio" in m and np.isfinite(float(m["moe/avg_maxvio"]))


def test_micro_batches_sized_to_the_groups_equal_the_padded_step():
  """8 groups packed in 8 rows-of-groups == padded to 16 groups; [4, 1] groups == 5 padded to 8."""
  mc, tc, opt, mesh, fns = _setup(kl_coef=0.04)
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)
  samples = _samples(40, seed=2)                   # 5 groups of 8 samples

  def run(chunks):
    mbs = [fns.put_batch(batch_lib.pack(c, rows, SEQ)) for c, rows in chunks]
    acc = fns.init_accum(state, mbs[0])
    for mb in mbs:
      acc = fns.accumulate(state, acc, mb)
    return fns.apply(state, acc)

  for sized, padded in (([(samples, 40)], [(samples, 64)]),
                        ([(samples[:32], 32), (samples[32:], 8)], [(samples, 64)])):
    _assert_same_update(*run(sized), *run(padded))  # kl ~ 0 here


def test_windowed_scoring_equals_log_softmax_of_the_full_forward():
  """Log-probs on the response window == an independent log-softmax of the full forward's
  logits at the same positions; the update from windowed batches equals the full-layout one."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.models import forward, logits_from_hidden  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.train.step.update import token_logprobs  # pylint: disable=import-outside-toplevel
  mc, tc, opt, mesh, fns = _setup(kl_coef=0.04)
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)
  samples = _samples(40, seed=3)
  full = batch_lib.pack(samples, ROWS, SEQ)
  win = batch_lib.pack(samples, ROWS, SEQ, window=4)
  assert win.targets.shape == (ROWS, 4)
  lp, _, _ = jax.jit(lambda p, b: token_logprobs(p, mc, tc, b))(state.params, fns.put_batch(win))
  logits = logits_from_hidden(state.params, mc, forward(
      state.params, mc, jnp.asarray(full.tokens), attention_mask=jnp.asarray(full.attention_mask))
      .hidden)
  ref = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits, axis=-1)),
                           full.targets[..., None], axis=-1)[..., 0]          # [rows, T]
  cols = win.score_start[:, None] + np.arange(4)[None, :]
  live = win.loss_mask > 0
  np.testing.assert_allclose(np.asarray(lp)[live], np.take_along_axis(ref, cols, 1)[live],
                             atol=2e-5)

  def run(b):
    mb = fns.put_batch(b)
    return fns.apply(state, fns.accumulate(state, fns.init_accum(state, mb), mb))

  _assert_same_update(*run(full), *run(win))


def test_rows_packed_to_their_own_length_equal_the_full_length_step():
  """A micro-batch packed to the length its rows need (`batch.row_length`, here 8 of 12
  columns: the last response token is only a target) gives the update and metrics of the same
  samples packed to the full seq_len."""
  mc, tc, opt, mesh, fns = _setup(kl_coef=0.04)
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)
  samples = _samples(40, seed=4)
  t = batch_lib.row_length(samples, SEQ, batch_lib.row_granule(8), window=4)
  assert t == 8                   # prompts of 5 + responses of up to 4, less the last token

  def run(seq):
    mb = fns.put_batch(batch_lib.pack(samples, ROWS, seq, window=4))
    return fns.fused_step(state, mb)

  _assert_same_update(*run(SEQ), *run(t), metric_atol=1e-7)


def test_fused_step_equals_the_pieces_and_keeps_the_parameters():
  """A one-micro-batch step as one program (donating, as the loop runs it) == init_accum +
  accumulate + apply; the parameters it read stay valid (the rollout engine shares them) and
  the frozen reference weights come back unchanged."""
  mc = load_model("tiny_moe", max_seq_len=SEQ).config
  tc = train_config_for_algo("grpo", kl_coef=0.04)
  opt = make_optimizer(tc.optim, ess_rule=tc.ess_rule, base_ess_ratio=tc.base_ess_ratio)
  mesh = make_mesh("1x1")
  fns = make_train_fns(mc, tc, opt, abstract_state(mc, tc, opt), mesh)   # donating
  mb = fns.put_batch(batch_lib.pack(_samples(40, seed=4), ROWS, SEQ))
  runs = []
  for fused in (True, False):
    state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)
    before, ref = _host(state.params), _host(state.ref_params)
    for _ in range(2):  # the second step starts from the donated-and-returned moments
      params = state.params
      if fused:
        state, m = fns.fused_step(state, mb)
      else:
        state, m = fns.apply(state, fns.accumulate(state, fns.init_accum(state, mb), mb))
      jax.tree.map(lambda a: a.block_until_ready(), params)          # still readable
    runs.append((state, m))
    jax.tree.map(np.testing.assert_array_equal, ref, _host(state.ref_params))
    assert int(state.step) == 2
  (a, ma), (b, mb_) = runs
  assert not np.array_equal(_host(a.params)["embed"], before["embed"])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=5e-6),
               _host(a.params), _host(b.params))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-9),
               _host(a.opt_state), _host(b.opt_state))
  for k in ("loss", "kl", "grad_norm", "update_norm", "num_tokens", "moe/avg_maxvio"):
    np.testing.assert_allclose(ma[k], mb_[k], rtol=1e-5, atol=1e-9, err_msg=k)


def test_behaviour_anchor_clips_against_the_rollout_logprobs():
  """`loss.old_policy="behaviour"`: the step's ratio is pi_theta / pi_behav, so its clip
  fractions equal a numpy count over exp(lp - behav) with DAPO's clip range (the default
  anchor, the proximal policy, has ratio 1: nothing clips, as the benchmark records)."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jaxrl_sys.models import forward, logits_from_hidden  # pylint: disable=import-outside-toplevel
  mc, tc, opt, mesh, _ = _setup(algo="dapo")
  coupled = dataclasses.replace(tc, loss=dataclasses.replace(
      tc.loss, decoupled=False, old_policy="behaviour"))
  cfns = make_train_fns(mc, coupled, opt, abstract_state(mc, coupled, opt), mesh, donate=False)
  state = init_train_state(mc, tc, opt, mesh=mesh, seed=0)
  b = batch_lib.pack(_samples(40, seed=5), ROWS, SEQ)
  logits = logits_from_hidden(state.params, mc, forward(
      state.params, mc, jnp.asarray(b.tokens), attention_mask=jnp.asarray(b.attention_mask))
      .hidden)
  lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64),
                          b.targets[..., None], axis=-1)[..., 0]
  live = b.loss_mask > 0
  # Behaviour log-probs off the current policy's by N(0, 0.5): ratios on both sides of 1.
  noise = np.random.default_rng(0).normal(0, 0.5, lp.shape)
  b = b._replace(behav_logprobs=np.where(live, lp + noise, 0).astype(np.float32))
  ratio = np.exp(lp - b.behav_logprobs)[live]
  adv = np.broadcast_to(b.advantages[:, None], live.shape)[live]
  low, high = (adv < 0) & (ratio < 0.8), (adv > 0) & (ratio > 1.28)
  assert 0 < low.mean() and 0 < high.mean()

  mb = cfns.put_batch(b)
  m = jax.device_get(cfns.apply(state, cfns.accumulate(state, cfns.init_accum(state, mb), mb))[1])
  np.testing.assert_allclose(m["clip_frac_low"], low.mean(), atol=1e-6)
  np.testing.assert_allclose(m["clip_frac_high"], high.mean(), atol=1e-6)
  with np.testing.assert_raises(ValueError):  # the behaviour weight would be 1: refused
    dataclasses.replace(tc.loss, decoupled=True, old_policy="behaviour")

"""LoRA adapters in the model: B = 0 is the base bit for bit; the adapted forward equals the
plain forward on weights merged in float64 numpy (dense, MoE experts on every path); targets;
the bfloat16 merge's rounding (measured and printed). The PEFT export is loaded by `peft` in
tests/harness/test_cli_harness.py (the LoRA learning run's adapters)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_sys import models
from jaxrl_sys.models import lora as lora_lib
from jaxrl_sys.models.config import LoraConfig
from jaxrl_sys.train.recipe.presets import load_model

LORA = LoraConfig(rank=4, alpha=8.0, targets="attention,mlp")


def _config(model: str, lora=LORA, **moe):
  mc = load_model(model, max_seq_len=16).config
  if moe:
    mc = dataclasses.replace(mc, moe=dataclasses.replace(mc.moe, **moe))
  return dataclasses.replace(mc, lora=lora)


def _perturbed(ad, seed=1, std=0.05):
  leaves, treedef = jax.tree.flatten(ad)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape)
                                      for x, k in zip(leaves, keys)])


def _merged_f64(params, ad, config):
  """W + s A B per adapted weight in float64 numpy, cast back to float32 (independent of
  `lora.merge_lora`)."""
  out = jax.tree.map(np.asarray, params)
  s = config.lora.alpha / config.lora.rank
  for path in lora_lib.target_paths(config):
    _, _, lead = lora_lib.WEIGHTS[path]
    node, ab = out["layers"], ad["layers"]
    for k in path[:-1]:
      node = node[k]
    for k in path:
      ab = ab[k]
    w = node[path[-1]].astype(np.float64)
    a = np.asarray(ab["a"], np.float64).reshape(*w.shape[:lead], -1, ab["a"].shape[-1])
    b = np.asarray(ab["b"], np.float64).reshape(*w.shape[:lead], ab["b"].shape[lead], -1)
    node[path[-1]] = (w + s * (a @ b).reshape(w.shape)).astype(np.float32)
  return out


def _tokens(vocab, seed=0):
  toks = np.random.default_rng(seed).integers(3, vocab, size=(3, 11)).astype(np.int32)
  mask = np.ones_like(toks)
  mask[1, 7:] = 0
  return jnp.asarray(toks), jnp.asarray(mask)


@jax.jit
def _rows(h, mask):
  return jnp.where(mask[..., None] > 0, h, 0)


@pytest.mark.parametrize("model", ["tiny", "tiny_moe"])
def test_zero_b_is_the_base_bit_for_bit_and_merged_weights_are_the_reference(model):
  mc = _config(model)
  base_mc = lora_lib.without_lora(mc)
  params = models.init_params(base_mc, jax.random.key(0))
  ad = lora_lib.init_lora(mc, jax.random.key(1))
  toks, mask = _tokens(mc.vocab_size)
  fwd = jax.jit(lambda p, a, c: models.forward(p, c, toks, attention_mask=mask, lora=a).hidden,
                static_argnums=2)
  base = fwd(params, None, base_mc)
  assert np.array_equal(np.asarray(fwd(params, ad, mc)), np.asarray(base))
  # Trained-looking adapters: the unmerged forward equals the plain forward on float64-merged
  # weights; every MoE path with expert adapters agrees.
  ad = _perturbed(ad)
  ref = np.asarray(_rows(fwd(_merged_f64(params, ad, mc), None, base_mc), mask))
  ours = np.asarray(_rows(fwd(params, ad, mc), mask))
  assert np.abs(ours - ref).max() < 2e-5 and np.abs(ours - np.asarray(base)).max() > 0.1
  if mc.moe is not None:
    for impl in ("dense", "ragged"):
      other = dataclasses.replace(mc, moe=dataclasses.replace(mc.moe, implementation=impl))
      got = np.asarray(_rows(fwd(params, ad, other), mask))
      assert np.abs(got - ref).max() < 2e-5, impl


def test_targets():
  dense, moe = load_model("tiny").config, load_model("tiny_moe").config

  def paths(mc, targets):
    return {".".join(p) for p in lora_lib.target_paths(
        dataclasses.replace(mc, lora=LoraConfig(rank=2, targets=targets)))}

  assert paths(dense, "attention") == {"attn.wq", "attn.wk", "attn.wv", "attn.wo"}
  assert paths(dense, "q,v,down") == {"attn.wq", "attn.wv", "mlp.w_down"}
  # On an MoE model "mlp" means the routed experts (the shared expert too, when there is one).
  assert paths(moe, "mlp") == {"moe.w_gate", "moe.w_up", "moe.w_down"}
  assert paths(moe, "experts,o") == {"moe.w_gate", "moe.w_up", "moe.w_down", "attn.wo"}
  with pytest.raises(ValueError, match="dense"):
    paths(dense, "experts")
  with pytest.raises(ValueError, match="no shared expert"):
    paths(moe, "shared")
  with pytest.raises(ValueError, match="unknown target"):
    LoraConfig(rank=2, targets="attention,lm_head")
  with pytest.raises(ValueError, match="slots"):
    paths(dataclasses.replace(moe, moe=dataclasses.replace(moe.moe, implementation="slots")),
          "mlp")
  assert dataclasses.replace(dense, lora=LoraConfig(rank=0)).lora is None  # rank 0: off


def test_bfloat16_merge_rounds_small_updates_away(capsys):
  """fp32 merge == unmerged (1e-5); a bf16 merge of an early-training-sized update leaves most
  weight entries unchanged: measured and printed (the figures docs/lora.md quotes)."""
  mc = _config("tiny")
  base_mc = lora_lib.without_lora(mc)
  params = models.init_params(base_mc, jax.random.key(0))
  ad = lora_lib.init_lora(mc, jax.random.key(1))
  toks, mask = _tokens(mc.vocab_size, seed=2)

  @jax.jit
  def logp(p, a):
    h = models.forward(p, mc, toks, attention_mask=mask, lora=a).hidden
    lp = jax.nn.log_softmax(models.logits_from_hidden(p, mc, h).astype(jnp.float32))
    return jnp.take_along_axis(lp[:, :-1], toks[:, 1:, None], -1)[..., 0] * mask[:, 1:]

  lines = []
  base_lp = np.asarray(logp(params, None))
  base16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
  base16_lp = np.asarray(logp(base16, None))
  for std in (1e-5, 1e-4, 1e-3):
    # A as initialised, B small: |dW| / |W| of an early update (a few optimizer steps).
    small = jax.tree_util.tree_map_with_path(
        lambda path, x: std * jax.random.normal(jax.random.key(len(lines)), x.shape)
        if path[-1].key == "b" else x, ad)
    unmerged = np.asarray(logp(params, small))
    fp32 = lora_lib.merge_lora(params, small, config=mc)
    np.testing.assert_allclose(np.asarray(logp(fp32, None)), unmerged, atol=1e-5)
    bf16 = lora_lib.merge_lora(params, small, config=mc, dtype="bfloat16")
    w = params["layers"]["attn"]["wq"]
    rel = float(jnp.linalg.norm(fp32["layers"]["attn"]["wq"] - w) / jnp.linalg.norm(w))
    unchanged = float(jnp.mean(bf16["layers"]["attn"]["wq"] == w.astype(jnp.bfloat16)))
    merged16 = np.asarray(logp(jax.tree.map(lambda x: x.astype(jnp.float32), bf16), None))
    unmerged16 = np.asarray(logp(base16, small))  # bf16 base, adapters beside it (float32)
    # Error of the update's effect on the log-probs, relative to the effect (float32 truth).
    true = unmerged - base_lp
    err = np.linalg.norm((merged16 - base16_lp) - true) / np.linalg.norm(true)
    err_unmerged = np.linalg.norm((unmerged16 - base16_lp) - true) / np.linalg.norm(true)
    lines.append(f"|dW|/|W| = {rel:.1e}: a bf16 merge leaves {unchanged:.0%} of wq entries "
                 f"unchanged; error of the update's log-prob effect: merged bf16 {err:.0%}, "
                 f"unmerged on the bf16 base {err_unmerged:.0%} (max |merged - unmerged| "
                 f"{np.abs(merged16 - unmerged16).max():.1e} nats)")
    if std == 1e-5:
      assert unchanged > 0.5  # most of a small update is rounded away
      assert err > 1 and err_unmerged < 0.1
  with capsys.disabled():
    print("\n" + "\n".join(lines))

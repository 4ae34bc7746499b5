"""Parity with `transformers` (PyTorch, CPU) on tiny random Qwen2 / Qwen3 / Llama checkpoints."""
import numpy as np
import pytest
import torch

import jax
import jax.numpy as jnp

from jaxrl_sys import models
from tests.models.hf_fixtures import make_hf_model, padded_batch

KINDS = ["qwen2", "qwen3", "llama"]


@pytest.fixture(scope="module", params=KINDS)
def hf_model(request, tmp_path_factory):
  d = str(tmp_path_factory.mktemp(request.param))
  torch_model = make_hf_model(request.param, d)
  config, params = models.load_hf_checkpoint(d)
  return request.param, d, torch_model, config, params


@pytest.mark.parametrize("pad_side", ["left", "right"])
def test_logits_match_transformers(hf_model, pad_side):
  kind, _, tm, config, params = hf_model
  toks, mask = padded_batch(config.vocab_size, [11, 7, 3], pad_side, seed=1)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    ref = tm(input_ids=torch.tensor(toks), attention_mask=torch.tensor(mask),
             position_ids=torch.tensor(pos)).logits.numpy()
  hidden = models.forward(params, config, jnp.asarray(toks, jnp.int32),
                          attention_mask=jnp.asarray(mask)).hidden
  ours = np.asarray(models.logits_from_hidden(params, config, hidden))
  valid = mask.astype(bool)
  assert np.abs(ours[valid] - ref[valid]).max() < 1e-4, kind


@pytest.mark.parametrize("pad_side", ["none", "left"])
def test_greedy_generation_matches_transformers(hf_model, pad_side):
  kind, _, tm, config, params = hf_model
  lengths = [6, 6] if pad_side == "none" else [9, 4]
  toks, mask = padded_batch(config.vocab_size, lengths, "left", seed=2)
  n_new = 12
  with torch.no_grad():
    ref = tm.generate(input_ids=torch.tensor(toks), attention_mask=torch.tensor(mask),
                      max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=0,
                      min_new_tokens=n_new).numpy()[:, toks.shape[1]:]
  out = models.generate(params, config, toks, mask,
                        sampling=models.SamplingConfig(temperature=0.0, max_new_tokens=n_new))
  np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=kind)
  assert (np.asarray(out.lengths) == n_new).all()


def test_right_padded_generation_equals_left_padded(hf_model):
  _, _, _, config, params = hf_model
  left, lmask = padded_batch(config.vocab_size, [9, 4], "left", seed=3)
  right = np.zeros_like(left)
  for i in range(2):
    ids = left[i][lmask[i] == 1]
    right[i, :len(ids)] = ids
  rmask = lmask[:, ::-1].copy()
  s = models.SamplingConfig(temperature=0.0, max_new_tokens=8)
  a = models.generate(params, config, left, lmask, sampling=s)
  b = models.generate(params, config, right, rmask, sampling=s)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)


def test_export_import_roundtrip_bit_exact(hf_model, tmp_path):
  kind, src, _, config, params = hf_model
  models.save_hf_checkpoint(str(tmp_path), config, params, max_shard_bytes=40_000)  # sharded
  config2, params2 = models.load_hf_checkpoint(str(tmp_path))
  assert config2 == config
  for (p1, a), (p2, b) in zip(jax.tree_util.tree_leaves_with_path(params),
                              jax.tree_util.tree_leaves_with_path(params2)):
    assert p1 == p2
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), (kind, p1)
  from jaxrl_sys.models.hf import safetensors_io
  orig, ours = safetensors_io.read_checkpoint(src), safetensors_io.read_checkpoint(str(tmp_path))
  assert set(orig) == set(ours)
  for k, v in ours.items():
    assert np.array_equal(orig[k], v), k


def test_exported_checkpoint_loads_in_transformers(hf_model, tmp_path):
  import transformers
  kind, _, tm, config, params = hf_model
  models.save_hf_checkpoint(str(tmp_path), config, params)
  back, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path),
                                                                 output_loading_info=True)
  back = back.float().eval()
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids = torch.tensor([[5, 9, 13, 2, 7]])
  with torch.no_grad():
    np.testing.assert_allclose(back(ids).logits.numpy(), tm(ids).logits.numpy(), atol=1e-6,
                               err_msg=kind)


def test_bias_free_qwen2_exports_zero_biases(tmp_path):
  import transformers
  cfg = models.ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                           head_dim=16, intermediate_size=64, architecture="Qwen2ForCausalLM")
  params = models.init_params(cfg, jax.random.PRNGKey(0))
  models.save_hf_checkpoint(str(tmp_path), cfg, params)
  tm, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path),
                                                               output_loading_info=True)
  assert not info["missing_keys"], info
  ids = np.array([[3, 9, 27, 5]])
  with torch.no_grad():
    ref = tm.float()(torch.tensor(ids)).logits.numpy()
  hidden = models.forward(params, cfg, jnp.asarray(ids)).hidden
  ours = models.logits_from_hidden(params, cfg, hidden)
  assert np.abs(np.asarray(ours) - ref).max() < 1e-4

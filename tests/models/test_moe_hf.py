"""Qwen3-MoE import/export: parity with `transformers` and a bit-exact round trip."""
import numpy as np
import torch

import jax
import jax.numpy as jnp

from jaxrl_sys import models
from tests.models.hf_fixtures import padded_batch


def test_qwen3_moe_parity_and_roundtrip(tmp_path):
  import transformers
  torch.manual_seed(0)
  cfg = transformers.Qwen3MoeConfig(
      vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64,
      tie_word_embeddings=False)
  tm = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
  with torch.no_grad():
    for name, p in tm.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  src = tmp_path / "src"
  tm.save_pretrained(str(src))
  config, params = models.load_hf_checkpoint(str(src))
  assert config.moe is not None and config.moe.num_experts == 8
  toks, mask = padded_batch(64, [9, 5, 2], "left", seed=4)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    ref = tm(input_ids=torch.tensor(toks), attention_mask=torch.tensor(mask),
             position_ids=torch.tensor(pos)).logits.numpy()
  h = models.forward(params, config, jnp.asarray(toks, jnp.int32),
                     attention_mask=jnp.asarray(mask)).hidden
  ours = np.asarray(models.logits_from_hidden(params, config, h))
  valid = mask.astype(bool)
  assert np.abs(ours[valid] - ref[valid]).max() < 1e-4
  # Routing replay on the imported model: the recorded routes are the experts transformers'
  # router picks, and forcing them back changes nothing.
  with torch.no_grad():
    hf_logits = tm(input_ids=torch.tensor(toks), attention_mask=torch.tensor(mask),
                   position_ids=torch.tensor(pos), output_router_logits=True).router_logits
  fwd = jax.jit(lambda p, r: models.forward(p, config, jnp.asarray(toks, jnp.int32),
                                            attention_mask=jnp.asarray(mask), routes=r,
                                            return_routes=True))
  live = fwd(params, None)
  routes = np.asarray(live.routes.experts)                     # [batch, seq, layers, k]
  for layer, lg in enumerate(hf_logits):
    want = np.argsort(-lg.numpy().reshape(*toks.shape, -1), axis=-1)[..., :2]
    np.testing.assert_array_equal(np.sort(routes[:, :, layer], -1)[valid],
                                  np.sort(want, -1)[valid])
  forced = fwd(params, live.routes)
  np.testing.assert_array_equal(np.asarray(forced.hidden), np.asarray(live.hidden))
  models.save_hf_checkpoint(str(tmp_path / "out"), config, params)
  config2, params2 = models.load_hf_checkpoint(str(tmp_path / "out"))
  assert config2 == config
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params2)):
    assert np.array_equal(np.asarray(a), np.asarray(b))

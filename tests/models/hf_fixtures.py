"""Tiny random-initialised HF checkpoints written with `save_pretrained` (no hub access)."""

import numpy as np

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def make_hf_model(kind: str, directory: str, seed: int = 0, **overrides):
  """Saves a tiny random `kind` in {"qwen2", "qwen3", "llama"} model; returns the torch model."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(seed)
  kw = dict(TINY, **overrides)
  if kind == "qwen2":
    cfg = transformers.Qwen2Config(**kw, rope_theta=10000.0, tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(cfg)
  elif kind == "qwen3":
    cfg = transformers.Qwen3Config(**kw, head_dim=16, rope_theta=1e6, tie_word_embeddings=True)
    model = transformers.Qwen3ForCausalLM(cfg)
  elif kind == "llama":
    kw.setdefault("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    cfg = transformers.LlamaConfig(**kw, rope_theta=500000.0, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
  else:
    raise ValueError(kind)
  # Random norms and biases too, so that a swapped or missing tensor shows up in the logits.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or name.endswith(".bias"):
        noise = 0.1 * torch.randn_like(p)
        p.copy_(1.0 + noise if name.endswith("weight") else noise)
  model = model.float().eval()
  model.save_pretrained(directory, safe_serialization=True)
  return model


def padded_batch(vocab: int, lengths, pad_side: str, seed: int = 0):
  """Random token ids `[batch, max_len]` and a 0/1 mask with the given padding side."""
  rng = np.random.default_rng(seed)
  t = max(lengths)
  toks = np.zeros((len(lengths), t), np.int64)
  mask = np.zeros((len(lengths), t), np.int64)
  for i, n in enumerate(lengths):
    ids = rng.integers(3, vocab, size=n)
    if pad_side == "left":
      toks[i, t - n:], mask[i, t - n:] = ids, 1
    else:
      toks[i, :n], mask[i, :n] = ids, 1
  return toks, mask

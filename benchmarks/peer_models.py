"""The peer comparison's tiny Hugging Face models, generated offline with `transformers`.

    python -m benchmarks.peer_models OUT_DIR   # writes OUT_DIR/qwen2-tiny, OUT_DIR/qwen3_moe-tiny

Random-initialised (seed 0) and saved with `save_pretrained` (safetensors), in the shapes of the
TRL / Tunix side-by-side: vocab 1024, hidden 256, 4 layers, 4 query / 2 KV heads of 64, tied
embeddings, rope theta 1e6, float32. Dense: Qwen2 with MLP 768 (3.4M parameters). MoE: Qwen3-MoE
with 8 experts, top-2, expert MLP 256 (7.4M parameters, 2.6M active per token).

The tokenizer is a character-level `tokenizers` WordLevel model (one id per printable ASCII
character, filler tokens up to the vocabulary size, `<|endoftext|>` = 0 as bos / eos / pad), so
an "a+b=" prompt costs as many tokens as with the peers' digit-splitting BPE.
"""
from __future__ import annotations

import argparse
import json
import os
import string

DENSE, MOE = "qwen2-tiny", "qwen3_moe-tiny"
COMMON = dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=1024, rope_theta=1e6,
              tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
              rms_norm_eps=1e-6)
EOS = "<|endoftext|>"


def write_tokenizer(directory: str, vocab_size: int) -> None:
  """Character-level tokenizer.json + tokenizer_config.json with exactly `vocab_size` ids."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=import-outside-toplevel
  chars = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
  vocab = [EOS] + chars
  vocab += [f"<|filler_{i}|>" for i in range(vocab_size - len(vocab))]
  tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=EOS))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens([EOS])
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"eos_token": EOS, "pad_token": EOS, "bos_token": EOS,
               "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)


def make_model(kind: str, directory: str, seed: int = 0) -> str:
  """Saves the dense ("qwen2") or MoE ("qwen3_moe") model and its tokenizer; returns the dir."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(seed)
  if kind == "qwen2":
    cfg = transformers.Qwen2Config(**COMMON, intermediate_size=768)
    model = transformers.Qwen2ForCausalLM(cfg)
  elif kind == "qwen3_moe":
    cfg = transformers.Qwen3MoeConfig(**COMMON, intermediate_size=768, moe_intermediate_size=256,
                                      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                      decoder_sparse_step=1, mlp_only_layers=[])
    model = transformers.Qwen3MoeForCausalLM(cfg)
  else:
    raise ValueError(f"unknown kind {kind!r}: qwen2 or qwen3_moe")
  os.makedirs(directory, exist_ok=True)
  model.float().save_pretrained(directory, safe_serialization=True)
  write_tokenizer(directory, cfg.vocab_size)
  return directory


def ensure_models(root: str) -> dict[str, str]:
  """`{"dense": dir, "moe": dir}` under `root`, generated when missing."""
  out = {}
  for key, name, kind in (("dense", DENSE, "qwen2"), ("moe", MOE, "qwen3_moe")):
    d = os.path.join(root, name)
    if not os.path.exists(os.path.join(d, "model.safetensors")):
      make_model(kind, d)
    out[key] = d
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("out_dir")
  print(json.dumps(ensure_models(ap.parse_args().out_dir)))


if __name__ == "__main__":
  main()

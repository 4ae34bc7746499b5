#!/usr/bin/env python
"""Build a tiny, randomly initialised Qwen-family causal LM plus a tiny tokenizer, offline (run
in the TRL venv of `benchmarks.peers.compare`).

    python benchmarks/peers/make_tiny_model.py OUT_DIR [--arch qwen2|qwen3|qwen3_moe|qwen2_moe]
        [--vocab 1024] [--hidden 256] [--layers 4] [--heads 4] [--kv-heads 2] [--seed 0]

Writes OUT_DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json, ...}
via save_pretrained (safetensors). No network access is needed.

Tokenizer: a byte-level BPE trained (deterministically) on a small synthetic corpus of arithmetic
expressions and pseudo-words, with exactly `--vocab` entries (incl. 3 special tokens), so the
model's vocab_size equals len(tokenizer) and every sampled id decodes.
Special tokens: <|endoftext|> (eos + pad), <|im_start|>, <|im_end|>.
"""

import argparse
import hashlib
import json
import os
import random

QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                           r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
  "{{ message['content'] }}<|im_end|>\n"
  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def synthetic_corpus(seed: int, n_lines: int = 20000):
  """Deterministic synthetic text: arithmetic + pseudo-words built from syllables."""
  rng = random.Random(seed)
  cons = "bcdfghjklmnprstvwz"
  vows = "aeiou"
  sylls = [c + v for c in cons for v in vows] + [v + c for v in vows for c in "nrst"]
  words = ["".join(rng.choice(sylls) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
  lines = []
  for i in range(n_lines):
    k = i % 4
    if k == 0:
      a, b = rng.randint(0, 999), rng.randint(0, 999)
      op = rng.choice("+-*")
      val = a + b if op == "+" else (a - b if op == "-" else a * b)
      lines.append(f"{a}{op}{b}={val}")
    elif k == 1:
      lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + ".")
    elif k == 2:
      a, b = rng.randint(0, 99), rng.randint(0, 99)
      lines.append(f"Question: what is {a} plus {b}? Answer: {a + b}")
    else:
      lines.append(
        " ".join(rng.choice(words).capitalize() for _ in range(rng.randint(1, 6)))
        + f" {rng.randint(0, 10000)}!"
      )
  return lines


def build_tokenizer(vocab_size: int, seed: int):
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  # Same normalizer / pre-tokenizer as transformers' Qwen2Tokenizer (digits split one by one), so
  # the tokenization is identical whether AutoTokenizer picks Qwen2Tokenizer (model_type qwen2)
  # or the generic TokenizersBackend / PreTrainedTokenizerFast (other model types, Tunix's HF
  # adapter).
  tok = Tokenizer(models.BPE(unk_token=None))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
  )
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=SPECIALS,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    min_frequency=1,
    show_progress=False,
  )
  tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
  got = tok.get_vocab_size()
  if got != vocab_size:
    raise SystemExit(f"tokenizer vocab {got} != requested {vocab_size}; enlarge the corpus")
  hf_tok = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token="<|endoftext|>",
    pad_token="<|endoftext|>",
    bos_token=None,
    unk_token=None,
    additional_special_tokens=SPECIALS[1:],
    model_max_length=2048,
    padding_side="left",
  )
  hf_tok.chat_template = CHAT_TEMPLATE
  return hf_tok


def build_config(args, tok):
  eos = tok.convert_tokens_to_ids("<|endoftext|>")
  common = dict(
    vocab_size=args.vocab,
    hidden_size=args.hidden,
    intermediate_size=args.intermediate,
    num_hidden_layers=args.layers,
    num_attention_heads=args.heads,
    num_key_value_heads=args.kv_heads,
    max_position_embeddings=args.max_pos,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=eos,
    eos_token_id=eos,
    pad_token_id=eos,
    rope_parameters={"rope_type": "default", "rope_theta": float(args.rope_theta)},
  )
  if args.arch == "qwen2":
    from transformers import Qwen2Config

    return Qwen2Config(**common)
  if args.arch == "qwen3":
    from transformers import Qwen3Config

    return Qwen3Config(head_dim=args.hidden // args.heads, **common)
  if args.arch == "qwen3_moe":
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
      head_dim=args.hidden // args.heads,
      num_experts=args.experts,
      num_experts_per_tok=args.top_k,
      moe_intermediate_size=args.moe_intermediate,
      decoder_sparse_step=1,
      norm_topk_prob=True,
      **common,
    )
  if args.arch == "qwen2_moe":
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
      num_experts=args.experts,
      num_experts_per_tok=args.top_k,
      moe_intermediate_size=args.moe_intermediate,
      shared_expert_intermediate_size=args.moe_intermediate,
      decoder_sparse_step=1,
      norm_topk_prob=True,
      **common,
    )
  raise SystemExit(f"unknown arch {args.arch}")


def main():
  ap = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("out_dir")
  ap.add_argument("--arch", default="qwen2", choices=["qwen2", "qwen3", "qwen3_moe", "qwen2_moe"])
  ap.add_argument("--vocab", type=int, default=1024)
  ap.add_argument("--hidden", type=int, default=256)
  ap.add_argument("--intermediate", type=int, default=768)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--heads", type=int, default=4)
  ap.add_argument("--kv-heads", type=int, default=2)
  ap.add_argument("--max-pos", type=int, default=1024)
  ap.add_argument("--experts", type=int, default=8)
  ap.add_argument("--top-k", type=int, default=2)
  ap.add_argument("--moe-intermediate", type=int, default=256)
  ap.add_argument(
    "--rope-theta",
    type=int,
    default=1_000_000,
    help="1e6 like Qwen2.5/Qwen3; google-tunix 0.1.7's Qwen3 ignores its config and uses 1e6",
  )
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()

  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  import torch
  from transformers import AutoModelForCausalLM

  tok = build_tokenizer(args.vocab, args.seed)
  config = build_config(args, tok)
  torch.manual_seed(args.seed)
  model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  model.eval()
  n_params = sum(p.numel() for p in model.parameters())

  os.makedirs(args.out_dir, exist_ok=True)
  model.save_pretrained(args.out_dir, safe_serialization=True)
  model.generation_config.save_pretrained(args.out_dir)
  tok.save_pretrained(args.out_dir)

  # sanity: reload both and run a forward pass
  from transformers import AutoTokenizer

  tok2 = AutoTokenizer.from_pretrained(args.out_dir)
  m2 = AutoModelForCausalLM.from_pretrained(args.out_dir, dtype=torch.float32)
  ids = tok2("12+34=", return_tensors="pt").input_ids
  with torch.no_grad():
    logits = m2(ids).logits
  assert logits.shape[-1] == args.vocab, logits.shape
  assert len(tok2) == args.vocab, len(tok2)
  h = hashlib.sha256(
    open(os.path.join(args.out_dir, "model.safetensors"), "rb").read()
  ).hexdigest()[:16]
  info = {
    "arch": args.arch,
    "params": n_params,
    "vocab": args.vocab,
    "hidden": args.hidden,
    "layers": args.layers,
    "heads": args.heads,
    "kv_heads": args.kv_heads,
    "tokens('12+34=')": ids[0].tolist(),
    "safetensors_sha256_16": h,
  }
  if "moe" in args.arch:
    info.update(experts=args.experts, top_k=args.top_k)
  print(json.dumps(info))


if __name__ == "__main__":
  main()

"""Writes a tiny random Hugging Face model directory to try `--model=DIR` without a download:

    python -m examples.make_tiny_hf_model /tmp/tiny-qwen3

A 2-layer Qwen3 (`transformers.Qwen3ForCausalLM.save_pretrained`, safetensors) with the
arithmetic task's character tokenizer as tokenizer.json, and a small chat template. The tokenizer
knows only the 20 characters "0123456789+-*/=():, "; any other character becomes its unknown
token "<pad>" (a run over such prompts says so when it starts).
"""
import json
import os
import sys


def main(directory: str) -> None:
  import torch
  import transformers

  from jaxrl_sys.tasks import CharTokenizer
  from jaxrl_sys.train.recipe.presets import MATH_CHARS
  tok = CharTokenizer(MATH_CHARS)
  torch.manual_seed(0)
  config = transformers.Qwen3Config(
      vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
      tie_word_embeddings=False, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
      pad_token_id=tok.pad_id)
  transformers.Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
  files = tok.hf_tokenizer_files()
  tok_config = json.loads(files["tokenizer_config.json"])
  # A chat template over the tokenizer's alphabet: "<s>(prompt):".
  tok_config["chat_template"] = ("{{ bos_token }}{% for m in messages %}({{ m['content'] }})"
                                 "{% endfor %}{% if add_generation_prompt %}:{% endif %}")
  files["tokenizer_config.json"] = json.dumps(tok_config, indent=2)
  for name, text in files.items():
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.write(text)
  print(f"wrote {directory}: {sorted(os.listdir(directory))}")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit("usage: python -m examples.make_tiny_hf_model DIR")
  main(sys.argv[1])

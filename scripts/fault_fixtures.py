"""The files the fault cases read: data files (sums, over-long and 1 MB prompts, empty, without
a prompt field, not UTF-8) and tiny Hugging Face checkpoints broken three ways."""
from __future__ import annotations

import json
import os

from fault_lib import py


def write_data(tmp: str) -> dict[str, str]:
  """Writes the cases' data files into `tmp`; {name: path}."""
  sums = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
  files = {"sums": sums,
           "long": [{"prompt": f"{i}=" + "9" * 2000, "answer": "1"} for i in range(3)]
           + [{"prompt": "1=", "answer": "1"}],
           "huge": sums[:57] + [{"prompt": "1+" * 500_000 + "1=", "answer": "2"}] + sums[57:]}
  out = {}
  for name, rows in files.items():
    out[name] = os.path.join(tmp, f"{name}.jsonl")
    with open(out[name], "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
  out["empty"] = os.path.join(tmp, "empty.jsonl")
  open(out["empty"], "w", encoding="utf-8").close()
  out["noprompt"] = os.path.join(tmp, "noprompt.jsonl")
  with open(out["noprompt"], "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                 for i in range(8))
  out["latin1"] = os.path.join(tmp, "latin1.jsonl")
  with open(out["latin1"], "wb") as f:
    f.write(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
  return out


def write_hf_dirs(tmp: str) -> dict[str, str]:
  """Writes three broken tiny Hugging Face checkpoints into `tmp`; {name: directory}."""
  code = f"""
import json, os, shutil, jax
from jaxrl_sys import models
from jaxrl_sys.tasks import CharTokenizer
from jaxrl_sys.train.recipe.presets import MATH_CHARS
tok = CharTokenizer(MATH_CHARS)
c = models.ModelConfig(vocab_size=tok.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=8, intermediate_size=32, max_seq_len=64,
                       qk_norm=True, architecture="Qwen3ForCausalLM", bos_token_id=tok.bos_id,
                       eos_token_id=tok.eos_id)
base = {tmp!r}
for name in ("broken_config", "truncated", "mislabelled"):
  d = os.path.join(base, "hf_" + name)
  models.save_hf_checkpoint(d, c, models.init_params(c, jax.random.PRNGKey(0)))
  for f, text in tok.hf_tokenizer_files().items():
    open(os.path.join(d, f), "w").write(text)
p = os.path.join(base, "hf_broken_config", "config.json")
open(p, "w").write(open(p).read()[:-30])
p = os.path.join(base, "hf_truncated", "model.safetensors")
data = open(p, "rb").read(); open(p, "wb").write(data[:len(data) // 2])
p = os.path.join(base, "hf_mislabelled", "config.json")
cfg = json.load(open(p)); cfg.update(architectures=["MistralForCausalLM"], model_type="mistral")
json.dump(cfg, open(p, "w"))
"""
  r = py(code, timeout=120)
  if r.rc != 0:
    raise RuntimeError(f"could not write the HF fixtures: {r.err[-2000:]}")
  return {n: os.path.join(tmp, "hf_" + n) for n in ("broken_config", "truncated", "mislabelled")}

"""A user's Hugging Face model end to end: file checks, chat template, no default warm-up,
`--export_hf` loaded back by `transformers` with our logits."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxrl_sys import models
from jaxrl_sys.tasks import CharTokenizer
from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.recipe.presets import MATH_CHARS, load_model
from tests.models.hf_fixtures import make_hf_model
from tests.train.common import quick

# Only characters of the tokenizer's alphabet (a word-level tokenizer maps others to <pad>).
TEMPLATE = ("{{ bos_token }}{% for m in messages %}({{ m['content'] }}){% endfor %}"
            "{% if add_generation_prompt %}:{% endif %}")


def _hf_dir(path, template=True):
  """A tiny random Qwen3 with the char tokenizer of the arithmetic task as tokenizer.json."""
  make_hf_model("qwen3", str(path))
  files = CharTokenizer(MATH_CHARS).hf_tokenizer_files()
  config = json.loads(files["tokenizer_config.json"])
  if template:
    config["chat_template"] = TEMPLATE
  files["tokenizer_config.json"] = json.dumps(config)
  for name, text in files.items():
    (path / name).write_text(text)
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
  (path / "config.json").write_text(json.dumps(cfg))
  return str(path)


def _ids(encoded):
  """Token ids from `apply_chat_template(tokenize=True)` (a list, or a BatchEncoding in
  transformers 5)."""
  return [int(i) for i in (encoded["input_ids"] if hasattr(encoded, "keys") else encoded)]


def test_missing_files_are_named(tmp_path):
  d = tmp_path / "m"
  os.makedirs(d)
  (d / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(ValueError) as e:
    load_model(str(d))
  text = str(e.value)
  for part in ("config.json is missing", "PyTorch pickles are not read",
               "safe_serialization=True", "tokenizer.json is missing"):
    assert part in text, text


def test_chat_template_matches_transformers(tmp_path):
  import transformers
  d = _hf_dir(tmp_path / "m")
  ref = transformers.AutoTokenizer.from_pretrained(d)
  ours = load_model(d).tokenizer
  msgs = [{"role": "user", "content": "3+4="}]
  expected = _ids(ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
  assert ours.encode("3+4=", bos=True) == expected
  raw = load_model(d, chat_template=False).tokenizer
  assert raw.encode("3+4=", bos=True) == [1] + ref("3+4=", add_special_tokens=False).input_ids
  # A prompt that fits raw but not templated: the error says the template made it long.
  from jaxrl_sys.train.loop.groups import encode_prompt
  assert len(encode_prompt(raw, "3+4=", 5)) == 5
  with pytest.raises(ValueError, match="chat template applied .*--nochat_template"):
    encode_prompt(ours, "3+4=", 5)


def test_train_and_export_loads_in_transformers(tmp_path):
  import transformers
  d = _hf_dir(tmp_path / "m")
  rc = quick(model=d, steps=2, out_dir=str(tmp_path / "run"), export_hf=str(tmp_path / "hf"),
             progress=False, sft_steps=None, learning_rate=1e-2)
  recipe = recipe_lib.build_recipe(rc)
  assert recipe.config.warmup.steps == 0  # a user's model is not fine-tuned on the answers
  result = recipe_lib.run_recipe(recipe)
  out = str(tmp_path / "hf")
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
    assert os.path.exists(os.path.join(out, name)), name
  tm = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
  tok = transformers.AutoTokenizer.from_pretrained(out)
  ids = np.asarray([_ids(tok.apply_chat_template([{"role": "user", "content": "2+7="}],
                                                 add_generation_prompt=True, tokenize=True))])
  with torch.no_grad():
    ref = tm(torch.tensor(ids)).logits.numpy()
  params, config = result.run.state.params, recipe.model.config
  hidden = models.forward(params, config, jnp.asarray(ids, jnp.int32)).hidden
  ours = np.asarray(models.logits_from_hidden(params, config, hidden))
  assert np.abs(ours - ref).max() < 1e-4  # the export is the run's final policy
  assert any("hf export" in line for line in result.outputs)


def test_tiny_preset_export_has_a_working_tokenizer(tmp_path):
  import transformers
  rc = quick(steps=1, out_dir=str(tmp_path / "run"), export_hf=str(tmp_path / "hf"),
             progress=False)
  result = recipe_lib.run_recipe(recipe_lib.build_recipe(rc))
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  ours = CharTokenizer(MATH_CHARS)
  assert tok("12+7=", add_special_tokens=False).input_ids == ours.encode("12+7=")
  assert (tok.eos_token_id, tok.pad_token_id) == (ours.eos_id, ours.pad_id)
  tm = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).float().eval()
  ids = np.asarray([ours.encode("3+4=", bos=True)])
  with torch.no_grad():
    ref = tm(torch.tensor(ids)).logits.numpy()
  mc = recipe_lib.build_recipe(rc).model.config
  hidden = models.forward(result.run.state.params, mc, jnp.asarray(ids, jnp.int32)).hidden
  ours_logits = np.asarray(models.logits_from_hidden(result.run.state.params, mc, hidden))
  assert np.abs(ours_logits - ref).max() < 1e-4

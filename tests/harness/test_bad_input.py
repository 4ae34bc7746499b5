"""Bad input found by issue 30's new-user cases: each a clear error (or a counted drop) from
`build_recipe` / the loaders, before any compilation; no training here."""
import json

import jax
import numpy as np
import pytest

from jaxrl_sys import models
from jaxrl_sys.models.hf import safetensors_io
from jaxrl_sys.train import recipe as recipe_lib
from tests.train.common import quick


@pytest.mark.parametrize("kw,message", [
    (dict(max_new_tokens=0), "loop.max_new_tokens=0 must be >= 1"),
    (dict(max_prompt_len=0), "loop.max_prompt_len=0 must be >= 1"),
    (dict(weight_store="s3:/x"), "rollout.weight_store=s3:/x is for Ray workers"),
    (dict(weight_store="tensorstore:/tmp/ws"), "the local rollout shares the trainer's weights"),
    (dict(mesh="64x64"), "--mesh needs 4096 devices .* faking more than 512 CPU devices"),
    (dict(out_dir="/proc/self/x"), "--out_dir=/proc/self/x: cannot write there"),
    (dict(max_prompt_len=100_000), r"needs at least .* TiB on one device; cpu has"),
])
def test_refused_before_any_work(kw, message):
  with pytest.raises(ValueError, match=message):
    recipe_lib.build_recipe(quick(**kw))


def test_given_max_new_tokens_is_kept():
  assert recipe_lib.build_recipe(quick(max_new_tokens=1)).config.loop.max_new_tokens == 1


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return f"jsonl:{path}"


def test_one_huge_prompt_is_dropped_by_the_default_cap(tmp_path):
  rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
  rows.insert(57, {"prompt": "1+" * 500_000 + "1=", "answer": "500001"})  # a 1 MB prompt
  recipe = recipe_lib.build_recipe(quick(task=_jsonl(tmp_path / "d.jsonl", rows)))
  rc = recipe.config.loop
  assert rc.max_prompt_len == 4 * 5  # 4 x the 99th percentile (bos + "a+b=" = 5 tokens)
  assert len(recipe.task.task) == 100
  assert recipe.model.config.max_seq_len == rc.max_prompt_len + rc.max_new_tokens
  (note,) = recipe.notes
  assert note.startswith("dropped 1 of 101 prompts longer than --max_prompt_len=20 tokens (first "
                         "row 57 (1000003 tokens): '1+1+") and len(note) < 300


def test_mostly_long_prompts_are_refused_with_row_and_80_characters(tmp_path):
  rows = [{"prompt": f"{i}=" + "9" * 2000, "answer": "1"} for i in range(3)]
  rows.append({"prompt": "1=", "answer": "1"})
  with pytest.raises(ValueError) as e:
    recipe_lib.build_recipe(quick(task=_jsonl(tmp_path / "d.jsonl", rows), max_prompt_len=16))
  msg = str(e.value)
  assert msg.startswith("3 of 4 prompts are longer than --max_prompt_len=16 tokens; first row 0 "
                        "(2003 tokens): '0=" + "9" * 78 + "'... (2002 characters)")
  assert len(msg) < 400


def test_non_utf8_data_names_the_file_and_line(tmp_path):
  p = tmp_path / "latin1.jsonl"
  p.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
  with pytest.raises(ValueError, match=f"{p} line 2 .*not UTF-8 text"):
    recipe_lib.build_recipe(quick(task=f"jsonl:{p}"))


def _tiny_qwen3(d):
  c = models.ModelConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, intermediate_size=32, max_seq_len=64,
                         qk_norm=True, architecture="Qwen3ForCausalLM")
  models.save_hf_checkpoint(str(d), c, models.init_params(c, jax.random.PRNGKey(0)))
  return c


def test_qwen3_weights_labelled_mistral_are_refused(tmp_path):
  _tiny_qwen3(tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  assert models.load_hf_checkpoint(str(tmp_path))[0].qk_norm  # the true label loads
  cfg.update(architectures=["MistralForCausalLM"], model_type="mistral")
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"MistralForCausalLM: unexpected tensor\(s\).*"
                                       r"self_attn.k_norm.weight.*would drop them.*Qwen3"):
    models.load_hf_checkpoint(str(tmp_path))


def test_broken_hf_files_are_named(tmp_path):
  _tiny_qwen3(tmp_path)
  cfg_path, st_path = tmp_path / "config.json", tmp_path / "model.safetensors"
  good_cfg, good_st = cfg_path.read_text(), st_path.read_bytes()
  cfg_path.write_text(good_cfg[:-20])
  with pytest.raises(ValueError, match=f"{cfg_path}: not valid JSON"):
    models.load_hf_checkpoint(str(tmp_path))
  cfg_path.write_text(json.dumps({k: v for k, v in json.loads(good_cfg).items()
                                  if k != "hidden_size"}))
  with pytest.raises(ValueError, match=f"{cfg_path}: missing field 'hidden_size'"):
    models.load_hf_checkpoint(str(tmp_path))
  cfg_path.write_text(good_cfg)
  for cut in (4, 100, len(good_st) - 7):
    st_path.write_bytes(good_st[:cut])
    with pytest.raises(safetensors_io.SafetensorsError, match=f"{st_path}: truncated"):
      models.load_hf_checkpoint(str(tmp_path))
  st_path.write_bytes(good_st)
  assert np.isfinite(models.load_hf_checkpoint(str(tmp_path))[1]["embed"]).all()

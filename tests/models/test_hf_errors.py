"""Clear errors for unknown architectures, missing tensors and unknown config keys."""
import json
import os

import numpy as np
import pytest

from jaxrl_sys import models
from jaxrl_sys.models.hf import safetensors_io


def _write(d, arch, tensors):
  os.makedirs(d, exist_ok=True)
  cfg = {"architectures": [arch], "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16}
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(cfg, f)
  safetensors_io.write_file(os.path.join(d, "model.safetensors"), tensors)


def test_unknown_architecture_is_named(tmp_path):
  _write(str(tmp_path), "GPTNeoXForCausalLM", {"x": np.zeros(2, np.float32)})
  with pytest.raises(ValueError, match="unsupported architecture 'GPTNeoXForCausalLM'"):
    models.load_hf_checkpoint(str(tmp_path))


def test_missing_tensors_are_named(tmp_path):
  _write(str(tmp_path), "LlamaForCausalLM",
         {"model.embed_tokens.weight": np.zeros((16, 8), np.float32)})
  with pytest.raises(ValueError, match=r"missing tensor\(s\).*model.norm.weight"):
    models.load_hf_checkpoint(str(tmp_path))


def test_unknown_config_key_is_named():
  with pytest.raises(ValueError, match="unknown config key.*hiden_size"):
    models.ModelConfig.from_dict({"hiden_size": 3})


def test_prompt_longer_than_context():
  import jax
  c = models.ModelConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                         head_dim=4, intermediate_size=16, max_seq_len=10)
  p = models.init_params(c, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="prompt longer than the context"):
    models.generate(p, c, np.zeros((1, 8), np.int32),
                    sampling=models.SamplingConfig(max_new_tokens=5))


def test_bf16_roundtrip(tmp_path):
  import ml_dtypes
  t = {"a": (np.arange(12, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(3, 4)}
  safetensors_io.write_file(str(tmp_path / "x.safetensors"), t)
  back = safetensors_io.read_file(str(tmp_path / "x.safetensors"))
  assert back["a"].dtype == ml_dtypes.bfloat16 and np.array_equal(back["a"], t["a"])


def test_dtypes_are_accepted_as_names_or_dtype_objects(tmp_path):
  import jax
  import jax.numpy as jnp
  c = models.ModelConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                         head_dim=4, intermediate_size=16, max_seq_len=10,
                         architecture="Qwen3ForCausalLM", qk_norm=True)
  assert models.ModelConfig(**{**c.__dict__, "param_dtype": jnp.bfloat16}).param_dtype == "bfloat16"
  assert models.ModelConfig(**{**c.__dict__, "compute_dtype": np.dtype("float32")}).compute_dtype \
      == "float32"
  with pytest.raises(ValueError, match="use one of"):
    models.ModelConfig(**{**c.__dict__, "param_dtype": jnp.int8})
  p = models.init_params(c, jax.random.PRNGKey(0))
  models.save_hf_checkpoint(str(tmp_path / "f32"), c, p, dtype=jnp.float32)
  models.save_hf_checkpoint(str(tmp_path / "bf16"), c, p, dtype=jnp.bfloat16)
  assert {v.dtype.name for v in safetensors_io.read_checkpoint(str(tmp_path / "f32")).values()} \
      == {"float32"}
  assert {v.dtype.name for v in safetensors_io.read_checkpoint(str(tmp_path / "bf16")).values()} \
      == {"bfloat16"}

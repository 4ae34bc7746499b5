"""Policy transformer (dense and MoE), KV cache, sampling and Hugging Face import.

Main entry points:
- `ModelConfig`, `RopeConfig`, `MoEConfig`: frozen configs.
- `init_params(config, key) -> params`; `param_axes(config)`: logical axes per parameter.
- `forward(params, config, tokens [batch, seq], ...)
  -> ForwardOutput(hidden [batch, seq, D], cache, aux)`.
- `logits_from_hidden`, `unembedding`: the output projection (logits are optional so the fused
  logprob kernel can consume hidden states directly).
- `KVCache`, `init_cache`: per-row incremental decoding state.
- `SamplingConfig`, `generate(...) -> GenerateOutput(tokens, logprobs, lengths, finished)`.
- `load_hf_checkpoint`, `save_hf_checkpoint`, `HFTokenizer`: Qwen2 / Qwen3 / Llama import-export;
  `export_hf`: a trained policy as an HF directory with its tokenizer files; `update_survival`:
  how much of a training run a cast to the export dtype keeps.
- `LoraConfig` (`ModelConfig.lora`) and `models.lora`: low-rank adapters beside the frozen
  parameters (`init_lora`, `forward(..., lora=adapters)`, `merge_lora`, `base_digest`);
  `models.hf.peft.export_peft`: adapters as a PEFT directory.
"""
from jaxrl_sys.models.config import LoraConfig, MoEConfig, ModelConfig, RopeConfig
from jaxrl_sys.models.hf.checkpoint import load_hf_checkpoint, load_hf_config, save_hf_checkpoint
from jaxrl_sys.models.hf.export import export_hf, update_survival
from jaxrl_sys.models.kv_cache import KVCache, init_cache
from jaxrl_sys.models.sampling import (GenerateOutput, SamplingConfig, check_context, decode_loop,
                                       generate, request_keys, sample_tokens)
from jaxrl_sys.models.tokenizer import HFTokenizer
from jaxrl_sys.models.transformer import (ForwardOutput, forward, init_params, last_valid_index,
                                          logits_from_hidden, num_params, param_axes, unembedding)

__all__ = [
    "ForwardOutput", "GenerateOutput", "HFTokenizer", "KVCache", "LoraConfig", "export_hf",
    "load_hf_checkpoint",
    "load_hf_config", "save_hf_checkpoint", "MoEConfig", "ModelConfig", "RopeConfig",
    "SamplingConfig", "check_context", "decode_loop", "forward", "generate", "init_cache",
    "init_params", "last_valid_index", "logits_from_hidden", "num_params", "param_axes",
    "request_keys", "sample_tokens", "unembedding", "update_survival",
]

"""Size limits checked before compiling: the default prompt bucket, long prompts, the memory a
prompt length implies, fake CPU device counts."""
import numpy as np
import pytest

from jaxrl_sys import backend
from jaxrl_sys.train.recipe import limits
from jaxrl_sys.train.recipe.presets import tiny_config


def test_default_prompt_len_ignores_an_outlier_and_respects_caps():
  rng = np.random.default_rng(0)
  bulk = rng.integers(10, 41, size=100).tolist()
  assert limits.default_prompt_len(bulk) == max(bulk)  # no outlier: the longest prompt
  # one 1 MB prompt among 100 normal ones: 4 x the 99th percentile (numpy 'lower': 40)
  assert limits.default_prompt_len(bulk + [1_000_000]) == 4 * int(
      np.quantile(bulk + [10**6], 0.99, method="lower")) == 160
  assert limits.default_prompt_len([30, 100]) == 100  # within 4 x the quantile: kept
  assert limits.default_prompt_len([5000] * 3) == limits.MAX_DEFAULT_PROMPT_LEN
  assert limits.default_prompt_len(bulk, context=25) == 25


def test_long_prompts_are_dropped_with_a_count_or_refused_briefly():
  prompts = ["a" * 9, "b" * 9, "x" * 1_000_000, "c" * 9]
  lengths = [len(p) + 1 for p in prompts]
  note = limits.check_dropped(prompts, lengths, 10, "--max_prompt_len")
  assert note.startswith("dropped 1 of 4 prompts longer than --max_prompt_len=10 tokens")
  assert "row 2 (1000001 tokens): '" + "x" * 80 + "'... (1000000 characters)" in note
  assert len(note) < 400
  assert limits.check_dropped(prompts, lengths, 2_000_000, "--max_prompt_len") is None
  with pytest.raises(ValueError) as e:
    limits.check_dropped(prompts, lengths, 5, "--max_prompt_len")
  msg = str(e.value)
  assert msg.startswith("4 of 4 prompts are longer than --max_prompt_len=5 tokens; first row 0 "
                        "(10 tokens): 'aaaaaaaaa'") and len(msg) < 400


def test_memory_lower_bound_refuses_an_impossible_prompt_length():
  cpus = backend.cpu_devices()
  if not cpus:
    pytest.skip("the bound checked here is the CPU's, and the CPU backend is not loaded")
  c = tiny_config(24, max_seq_len=100_004)
  cpu = cpus[0]
  # 16 rows x 4 heads x 100004^2 float32 scores alone: 2.3 TiB
  need = limits.min_step_bytes(c, 16, 100_004, platform="cpu")
  assert need >= 16 * 4 * 100_004**2 * 4
  with pytest.raises(ValueError, match=r"16 rows x 100004 tokens .* needs at least 2.3 TiB.*"
                                       r"Lower --max_prompt_len"):
    limits.check_memory(c, 16, 100_004, cpu)
  limits.check_memory(c, 16, 12, cpu)  # the test shapes: a few KB


def test_fake_device_counts():
  limits.check_fake_devices(32, 32, "cpu")
  limits.check_fake_devices(4096, 4096, "tpu")  # real devices: fine
  with pytest.raises(ValueError, match="--mesh needs 4096 devices .* refused"):
    limits.check_fake_devices(4096, 1, "cpu")
  assert "takes minutes" in limits.fake_devices_note(256)
  assert limits.fake_devices_note(32) is None and limits.fake_devices_note(4096) is None

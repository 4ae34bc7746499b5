"""`benchmarks.gpu --quick` runs on CPU, covers every implementation and writes its JSON."""
import json

from benchmarks import common
from benchmarks import gpu
from jaxrl_sys import backend


def test_gpu_benchmark_quick(tmp_path, monkeypatch):
  monkeypatch.setattr(common, "RESULTS_DIR", str(tmp_path))
  gpu.main(["--quick", "--out", "gpu_test", "--profile", str(tmp_path / "trace")])
  saved = json.loads((tmp_path / "gpu_test.json").read_text())
  assert saved["device"]["device"] and saved["device"]["platform"] == backend.platform()
  gpu_host = backend.platform() == "gpu"
  rows = saved["rows"]
  assert not [r for r in rows if r.get("error")], [r for r in rows if r.get("error")]
  kern = [r for r in rows if r["section"] == "kernel"]
  naive = {"fused_logprobs": "naive", "flash_attention": "xla",
           "grouped_matmul": "einsum_equal_groups"}
  for kernel in ("fused_logprobs", "flash_attention", "grouped_matmul"):
    mine = [r for r in kern if r["name"] == kernel]
    # Every implementation but Pallas (interpret mode off GPU unless --pallas), and the naive.
    want = {naive[kernel]} | set(backend.KERNELS[kernel]) - (set() if gpu_host else {"pallas"})
    if kernel == "fused_logprobs":   # and the token path with its vocabulary-chunk backward
      want |= {f"xla_tokens vocab-bwd {gpu.VOCAB_BWD_CHUNK}"}
    assert {r["impl"] for r in mine} == want, kernel
    assert [r["impl"] for r in mine if r["auto"]] == [backend.kernel_impl(kernel)]
    assert all(r["fwdbwd_ms"] > 0 and r["fwdbwd_temp_mib"] >= 0 for r in mine)
    assert [r["vs_naive"] for r in mine if r["impl"] == naive[kernel]] == [1.0]
  s = gpu.sizes(quick=True)
  (dec,) = [r for r in rows if r["section"] == "decode"]
  assert dec["generated"] == s.decode_batches[0] * s.new_tokens    # no stop token: all tokens
  assert (dec["roofline_frac"] is None) == (not gpu_host)          # no HBM figure for a CPU
  assert dec["tok_per_s"] > 0
  # What the compiled step loop runs per step (`benchmarks.hlo_stats` of generate's program):
  # at least the step's own sampling and the layer loop's kernels, copies counted in bytes.
  assert dec["kernels_per_step"] > s.dense.num_layers and dec["copies_per_step"] >= 0
  assert dec["copy_mib_per_step"] >= 0 and dec["update_slices_per_step"] >= 1   # cache write
  train = [r for r in rows if r["section"] == "train"]
  # The one-program step and the CLI's micro-batched step (2 groups, m_b = 1: two micro-batches).
  assert [(r["name"], r["impl"], r["micro_batches"]) for r in train] == [
      ("grpo step Qwen3-MoE", "1 program", 1), ("grpo step Qwen3-MoE", "2 x 1 groups", 2)]
  assert all(0 < r["mfu"] < 1 and r["fwdbwd_temp_mib"] > 0 for r in train)
  # The feature rows (issue 45's last bullet): the engine's decode, plain and with unmerged
  # adapters (their extra matmuls run in the step), generating every token it was asked for.
  lora = {r["impl"]: r for r in rows if r["section"] == "lora"}
  assert set(lora) == {"plain", "unmerged rank 8"}
  assert all(r["generated"] == s.decode_batches[0] * s.new_tokens for r in lora.values())
  assert lora["unmerged rank 8"]["kernels_per_step"] > lora["plain"]["kernels_per_step"]
  assert lora["plain"]["vs_base"] == 1.0
  # MoE decode steps with route capture off and on, the overhead their ratio.
  routes = {r["impl"]: r for r in rows if r["section"] == "routes"}
  assert set(routes) == {"capture off", "capture on"}
  on, off = routes["capture on"], routes["capture off"]
  assert abs(on["capture_overhead_pct"] - 100 * (on["step_ms"] / off["step_ms"] - 1)) < 1e-6
  # The agentic episodes, async vs barrier: on a CPU both runs sample identical episodes.
  agentic = {r["tool_latency"]: r for r in rows if r["section"] == "agentic"}
  assert set(agentic) == {"0", "heavy"}
  for r in agentic.values():
    assert r["same_tokens"] == 1.0
    assert 0 <= r["async_idle"] <= 1 and 0 <= r["barrier_idle"] <= 1
  # The per-op profile of the decode and the train step (host process on CPU).
  assert set(saved["profile"]) == {"decode_b4", "train Qwen3-MoE"}
  for ops in saved["profile"].values():
    assert ops and all(o["ms_per_call"] >= 0 and 0 <= o["share"] <= 1 for o in ops)
    assert sum(o["share"] for o in ops) <= 1 + 1e-6
  # Totals over all ops: kernels per step and the time shares of copies / slice updates.
  assert set(saved["profile_totals"]) == {"decode_b4", "train Qwen3-MoE"}
  for tot in saved["profile_totals"].values():
    assert tot["kernels_per_step"] > 0 and tot["ms_per_step"] > 0
    assert 0 <= tot["copy_share"] <= 1 and 0 <= tot["update_slice_share"] <= 1


def test_device_slug_names_the_results():
  assert gpu.device_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
  assert gpu.device_slug("NVIDIA H200") == "h200" and gpu.device_slug("cpu") == "cpu"

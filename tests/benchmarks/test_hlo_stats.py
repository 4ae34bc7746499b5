"""`benchmarks.hlo_stats` on a hand-written optimized-HLO text whose counts are known: a step
loop of 256 trips holding a layer loop of 24 trips and a called computation."""
from benchmarks import hlo_stats

HLO = """HloModule m, entry_computation_layout={(f32[16]{0})->f32[16]{0}}

%fused_computation (p: bf16[2,8]) -> bf16[8] {
  %p = bf16[2,8]{1,0} parameter(0)
  ROOT %copy.9 = bf16[8]{0} copy(%p)
}

%inner_body (t: (s32[], bf16[2,8])) -> (s32[], bf16[2,8]) {
  %t = (s32[], bf16[2,8]{1,0}) parameter(0)
  %gte = s32[] get-tuple-element(%t), index=0
  %x = bf16[2,8]{1,0} get-tuple-element(%t), index=1
  %copy.2 = bf16[2,8]{1,0} copy(%x)
  %dynamic-slice_fusion = bf16[8]{0} fusion(%x, %gte), kind=kLoop, calls=%fused_computation
  %gemm = bf16[8]{0} custom-call(%dynamic-slice_fusion), custom_call_target="__cublas$gemm"
  %b = bf16[2,8]{1,0} bitcast(%copy.2)
  ROOT %tuple = (s32[], bf16[2,8]{1,0}) tuple(%gte, %b)
}

%called (x: s32[]) -> s32[] {
  %x = s32[] parameter(0)
  ROOT %copy.3 = s32[] copy(%x)
}

%outer_body (t: (s32[], f32[16])) -> (s32[], f32[16]) {
  %t = (s32[], f32[16]{0}) parameter(0)
  %init = (s32[], bf16[2,8]{1,0}) constant({...})
  %while.1 = (s32[], bf16[2,8]{1,0}) while(%init), condition=%cond, body=%inner_body, \
backend_config={"known_trip_count":{"n":"24"}}
  %dynamic-update-slice_fusion = f32[16]{0} fusion(%t), kind=kLoop, calls=%fused_computation
  %i = s32[] get-tuple-element(%t), index=0
  %call.1 = s32[] call(%i), to_apply=%called, frontend_attributes={a="b"}
  ROOT %tuple.2 = (s32[], f32[16]{0}) tuple(%call.1, %dynamic-update-slice_fusion)
}

ENTRY %main (a: f32[16]) -> f32[16] {
  %a = f32[16]{0} parameter(0)
  %init0 = (s32[], f32[16]{0}) tuple(%a, %a)
  %while.0 = (s32[], f32[16]{0}) while(%init0), condition=%cond0, body=%outer_body, \
backend_config={"known_trip_count":{"n":"256"}}
  ROOT %copy.4 = f32[16]{0} copy(%a)
}
""".replace("\\\n", "")


def test_counts_per_loop_and_per_step():
  assert hlo_stats.shape_bytes("(s32[], bf16[2,8]{1,0})") == 4 + 32
  s = hlo_stats.summary(HLO)
  # Entry: one copy of f32[16] (the while, tuple and parameter are no kernels).
  assert s["entry"] == dict(kernels=1, copies=1, copy_bytes=64, write_bytes=64, slice_fusions=0,
                            update_slices=0)
  outer, inner = s["loops"]
  assert (outer["loop"], outer["depth"], outer["trip_count"]) == ("while.0", 0, 256)
  assert (inner["loop"], inner["parent"], inner["trip_count"]) == ("while.1", "outer_body", 24)
  # Layer body: a copy of bf16[2,8] (32 bytes), a slicing fusion and a library call.
  # Writes: the copy (32 bytes), the slice and the product (bf16[8]: 16 bytes each).
  assert inner["own"] == dict(kernels=3, copies=1, copy_bytes=32, write_bytes=64,
                              slice_fusions=1, update_slices=0)
  # Step body: the update fusion and the called computation's s32 copy, plus 24 layers.
  # (the in-place update's f32[16] output is not counted as written).
  assert outer["own"] == dict(kernels=2, copies=1, copy_bytes=4, write_bytes=4,
                              slice_fusions=0, update_slices=1)
  assert outer["per_iteration"] == dict(kernels=2 + 24 * 3, copies=1 + 24, copy_bytes=4 + 24 * 32,
                                        write_bytes=4 + 24 * 64, slice_fusions=24,
                                        update_slices=1)
  assert hlo_stats.per_step(HLO) == dict(loop="while.0", trip_count=256, **outer["per_iteration"])
  assert hlo_stats.per_step("HloModule empty\n") is None
  largest = hlo_stats.per_step_largest(HLO)
  assert largest["while.0 (step)"] == [("copy.3", "copy", 4 / 2 ** 20)]
  assert [n for n, _, _ in largest["while.1 (x24)"]] == ["copy.2", "dynamic-slice_fusion",
                                                          "gemm"]

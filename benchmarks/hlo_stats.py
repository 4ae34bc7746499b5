"""What a compiled program runs per loop iteration, read from its optimized HLO text.

    stats = loop_stats(jax.jit(f).lower(*args).compile().as_text())

Every instruction of a computation that is not fused into another and is not free (parameter,
tuple, get-tuple-element, bitcast, constant, control flow) runs as one kernel on a GPU: a
fusion, a library call (custom-call: cuBLAS, cuDNN, Triton), a copy, an in-place
dynamic-update-slice. For each while loop, `loop_stats` counts those kernels in its body, the
copies among them and the bytes they write, the fusions that only slice (`dynamic-slice` in the
fusion's name: on a GPU these materialize a slice, e.g. one layer of a stacked weight or cache),
the in-place updates and the bytes the other kernels write, per iteration of the loop and per
iteration including its nested loops (times their trip counts, where XLA knows them); and the
kernels with the largest outputs (a whole-cache convert or copy per step shows there).
"""
from __future__ import annotations

import math
import re

FREE = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "while",
        "conditional", "call", "after-all", "partition-id", "replica-id", "opt-barrier"}
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
               "f8e4m3fn": 1, "f8e5m2": 1}
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(")
_ARRAY = re.compile(r"([a-z0-9]+)\[([\d,]*)\]")


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape string (a tuple's: the sum of its arrays)."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    if dtype in DTYPE_BYTES:
      total += DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return total


def _split_instruction(line: str):
  """(name, shape, opcode, rest) of an instruction line, or None."""
  line = line.strip()
  if line.startswith("ROOT "):
    line = line[5:]
  if not line.startswith("%") or " = " not in line:
    return None
  name, rest = line[1:].split(" = ", 1)
  if rest.startswith("("):
    depth = 0
    for j, ch in enumerate(rest):
      depth += (ch == "(") - (ch == ")")
      if depth == 0:
        break
    shape, rest = rest[:j + 1], rest[j + 2:]
  else:
    shape, _, rest = rest.partition(" ")
  opcode = rest.split("(", 1)[0]
  return name, shape, opcode, rest


def computations(text: str) -> dict[str, list[tuple[str, str, str, str]]]:
  """{computation name: [(name, shape, opcode, rest), ...]}; the entry is named "ENTRY"."""
  comps: dict[str, list] = {}
  current = None
  for line in text.splitlines():
    m = _HEADER.match(line)
    if m and line.rstrip().endswith("{"):
      current = "ENTRY" if m.group(1) else m.group(2)
      comps[current] = []
    elif line.startswith("}"):
      current = None
    elif current is not None:
      inst = _split_instruction(line)
      if inst:
        comps[current].append(inst)
  return comps


def _is_update(inst) -> bool:
  return bool(re.search(r"dynamic[-_]update[-_]slice|scatter", inst[0] + inst[2]))


def _own(instructions) -> dict:
  kernels = [i for i in instructions if i[2] not in FREE]
  copies = [i for i in kernels if i[2] == "copy"]
  return {"kernels": len(kernels), "copies": len(copies),
          "copy_bytes": sum(shape_bytes(i[1]) for i in copies),
          # Bytes the kernels write, in-place updates left out (their output is the whole
          # buffer, but they write only the update).
          "write_bytes": sum(shape_bytes(i[1]) for i in kernels if not _is_update(i)),
          "slice_fusions": sum(1 for i in kernels if i[2] == "fusion"
                               and re.search(r"dynamic[-_]slice", i[0])),
          "update_slices": sum(1 for i in kernels if _is_update(i))}


def largest_writes(instructions, n: int = 5) -> list[tuple[str, str, float]]:
  """The `n` kernels of `instructions` with the largest outputs: (name, opcode, MiB)."""
  kernels = [i for i in instructions if i[2] not in FREE and not _is_update(i)]
  kernels.sort(key=lambda i: -shape_bytes(i[1]))
  return [(i[0], i[2], shape_bytes(i[1]) / 2 ** 20) for i in kernels[:n]]


def _called(rest: str) -> list[str]:
  """Computations an unfused `call` / `conditional` runs (inlined into its caller here)."""
  found = re.findall(r"(?:to_apply|branch_computations|true_computation|false_computation)="
                     r"\{?([^}]*?)\}?(?:,\s*[a-z_]+=|$)", rest)
  return [n.strip().lstrip("%") for group in found for n in group.split(",") if n.strip()]


def loop_stats(text: str) -> list[dict]:
  """One row per while loop: {loop, parent, trip_count (None: unknown), own: counts of its body
  alone, per_iteration: the body's counts plus each nested loop's per_iteration times its trip
  count (unknown: once)}. The counts: kernels, copies, copy_bytes, slice_fusions,
  update_slices (see the module docstring). Outermost loops first."""
  comps = computations(text)
  caller = {}  # computation run by an unfused call / conditional -> the computation calling it
  for parent, insts in comps.items():
    for _, _, opcode, rest in insts:
      if opcode in ("call", "conditional"):
        for callee in _called(rest):
          caller[callee] = parent
  inlined = {name: list(insts) for name, insts in comps.items()}
  for callee, parent in caller.items():
    top = parent
    while top in caller:
      top = caller[top]
    inlined.setdefault(top, []).extend(comps.get(callee, []))
  loops = {}   # body computation -> (parent computation, trip count, while instruction name)
  for comp, insts in comps.items():
    parent = comp
    while parent in caller:   # a loop inside a called computation belongs to the caller
      parent = caller[parent]
    for name, _, opcode, rest in insts:
      if opcode == "while":
        body = re.search(r"body=%?([\w.\-]+)", rest)
        trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
        if body:
          loops[body.group(1)] = (parent, int(trip.group(1)) if trip else None, name)

  def per_iteration(body: str) -> dict:
    total = _own(inlined.get(body, []))
    for child, (parent, trip, _) in loops.items():
      if parent == body:
        sub = per_iteration(child)
        for k in total:
          total[k] += sub[k] * (trip or 1)
    return total

  def depth(body: str) -> int:
    parent = loops[body][0]
    return 0 if parent not in loops else 1 + depth(parent)

  rows = [{"loop": name, "body": body, "parent": parent, "depth": depth(body),
           "trip_count": trip, "own": _own(inlined.get(body, [])),
           "per_iteration": per_iteration(body),
           "largest_writes": largest_writes(inlined.get(body, []))}
          for body, (parent, trip, name) in loops.items()]
  return sorted(rows, key=lambda r: (r["depth"], r["loop"]))


def summary(text: str) -> dict:
  """The whole program's top-level kernel counts (`_own` of the entry) and its loops."""
  return {"entry": _own(computations(text).get("ENTRY", [])), "loops": loop_stats(text)}


def per_step(text: str) -> dict | None:
  """`per_iteration` of the outermost loop with the most kernels per iteration (a decode
  program's step loop; its layer loop nested inside), with its trip count; None: no loop."""
  top = [r for r in loop_stats(text) if r["depth"] == 0]
  if not top:
    return None
  best = max(top, key=lambda r: r["per_iteration"]["kernels"])
  return {"loop": best["loop"], "trip_count": best["trip_count"], **best["per_iteration"]}


def per_step_largest(text: str, n: int = 5) -> dict[str, list]:
  """`largest_writes` of the `per_step` loop's body and of each loop nested in it, by loop
  name (with its trip count): where a step's bytes are written."""
  rows = loop_stats(text)
  step = per_step(text)
  if step is None:
    return {}
  body = next(r["body"] for r in rows if r["loop"] == step["loop"])
  out = {f"{step['loop']} (step)": next(r["largest_writes"] for r in rows
                                        if r["loop"] == step["loop"])}
  for r in rows:
    if r["parent"] == body:
      out[f"{r['loop']} (x{r['trip_count']})"] = r["largest_writes"][:n]
  return out

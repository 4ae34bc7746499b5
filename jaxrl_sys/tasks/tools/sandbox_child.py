"""The child process of a sandboxed tool call (run by file path, imports nothing of jaxrl_sys).

Reads one JSON request from stdin: `{"ref": "module:function", "arguments": ..., "sys_path":
[...], "cpu_seconds": s, "memory_mb": m}`; sets its own CPU-time and address-space limits
before importing the tool; calls it; writes the raw output bytes to stdout and exits 0, or
writes `ERROR <type>: <message>` to stderr and exits 3 (an exception), 4 (MemoryError).
A child killed by its CPU limit dies from SIGXCPU / SIGKILL (the parent reads the signal).
"""
import importlib
import json
import resource
import sys


def _limit(kind: int, value: int) -> None:
  soft, hard = resource.getrlimit(kind)
  new = value if hard == resource.RLIM_INFINITY else min(value, hard)
  resource.setrlimit(kind, (new, hard if hard != resource.RLIM_INFINITY else new))


def main() -> int:
  req = json.loads(sys.stdin.buffer.read().decode("utf-8"))
  cpu, mem = req.get("cpu_seconds"), req.get("memory_mb")
  if cpu:
    _limit(resource.RLIMIT_CPU, max(int(-(-float(cpu) // 1)), 1))
  if mem:
    _limit(resource.RLIMIT_AS, int(mem) * 2 ** 20)
  sys.path[:0] = [p for p in req.get("sys_path", []) if p not in sys.path]
  module, _, name = req["ref"].partition(":")
  try:
    fn = getattr(importlib.import_module(module), name)
    args = req["arguments"]
    out = fn(**args) if isinstance(args, dict) else fn(args)
    if isinstance(out, str):
      out = out.encode("utf-8", "surrogatepass")
    elif not isinstance(out, (bytes, bytearray)):
      out = (json.dumps(out) if isinstance(out, (dict, list)) else str(out)).encode("utf-8")
  except MemoryError:
    sys.stderr.write("ERROR MemoryError: the memory limit was reached\n")
    return 4
  except BaseException as e:  # pylint: disable=broad-except
    sys.stderr.write(f"ERROR {type(e).__name__}: {e}\n")
    return 3
  sys.stdout.buffer.write(bytes(out))
  sys.stdout.flush()
  return 0


if __name__ == "__main__":
  sys.exit(main())

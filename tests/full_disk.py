"""A real full disk for the fault tests: a small tmpfs mounted over a directory (root only)."""
import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def full_disk(path, size: str = "300k"):
  """Mounts a tmpfs of `size` at `path` (created) for the block; skips the test where mounting
  is not permitted (not root, or no CAP_SYS_ADMIN in a container)."""
  path = str(path)
  os.makedirs(path, exist_ok=True)
  got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True, check=False)
  if got.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here ({got.stderr.strip()[:80]})")
  try:
    yield path
  finally:
    subprocess.run(["umount", "-l", path], check=False)

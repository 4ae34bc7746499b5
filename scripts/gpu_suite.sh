#!/usr/bin/env bash
# Runs the backend-portable part of the suite (kernels, models, losses, train) natively on one
# GPU: `bash scripts/gpu_suite.sh [pytest args]`. Float32 comparisons run at HIGHEST matmul
# precision (tests/precision_helpers.py), tests that need more devices skip with a reason, and
# the Ray tests are left out when Ray is not installed. Several xdist workers share the GPU, each
# with a slice of its memory. CI stays on CPU; this is for a machine that has a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORKERS=${WORKERS:-4}
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-$(
  "$PY" -c "print(round(0.9 / $WORKERS, 3))")}
ignore=()
if ! "$PY" -c "import ray" 2>/dev/null; then
  echo "Ray is not installed: leaving out the Ray tests" >&2
  ignore=(--ignore=tests/train/loop/test_elastic_loop.py
          --ignore=tests/train/loop/test_offload_loop.py)
fi
"$PY" -m pytest -n "$WORKERS" --dist loadgroup -p no:cacheprovider \
  tests/kernels tests/models tests/losses tests/train "${ignore[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi
exit "$rc"

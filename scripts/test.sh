#!/usr/bin/env bash
# Installs the test environment (with Ray: the elastic-rollout tests run real Ray workers) and
# runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test,ray
# Python's default: a process caches the bytecode of what it imports (__pycache__, git-ignored),
# so that the suite's ~60 processes (pytest workers, CLI runs, Ray actors, notebook kernels)
# compile the package and the rewritten test modules once, not each. Some sandboxes export
# PYTHONDONTWRITEBYTECODE=1; the installed packages are compiled by setup_env.sh either way.
unset PYTHONDONTWRITEBYTECODE
set +e
.venv/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"

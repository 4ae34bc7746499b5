#!/usr/bin/env bash
# Installs the test environment (with Ray: the elastic-rollout tests run real Ray workers) and
# runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test,ray
set +e
.venv/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"

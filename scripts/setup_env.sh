#!/usr/bin/env bash
# Creates ./.venv with the tested dependency set (idempotent). Usage: bash scripts/setup_env.sh [extras]
# An environment installed with more extras serves a request for fewer: after `test,ray`, a
# request for `test` installs nothing (CI installs once, then lints and tests).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
hash="$(cat pyproject.toml requirements/constraints-py311.txt | sha1sum | cut -c1-12)"
for stamp in .venv/.installed-*-"$hash"; do
  [ -f "$stamp" ] || continue
  have="${stamp#.venv/.installed-}"
  have=",${have%-"$hash"},"
  missing=0
  for extra in ${extras//,/ }; do
    [[ "$have" == *",$extra,"* ]] || missing=1
  done
  if [ "$missing" -eq 0 ]; then
    exit 0
  fi
done
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
cons=()
if .venv/bin/python -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  cons=(-c requirements/constraints-py311.txt)
fi
.venv/bin/python -m pip install -q --no-compile "${cons[@]}" -e ".[$extras]" \
  2> >(grep -v "is ignored" >&2)
# The bytecode of every installed module, compiled on all cores (pip compiles one file after
# another: ~1.5x longer on 2 cores). A few files that packages ship as data are not Python 3 and
# fail here, as they fail silently under pip.
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
.venv/bin/python -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
touch ".venv/.installed-$extras-$hash"

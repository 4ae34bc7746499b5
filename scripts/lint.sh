#!/usr/bin/env bash
# Lint (what CI runs before the tests): `ruff check .` with the rules in pyproject.toml
# ([tool.ruff]: pyflakes + pycodestyle, 2-space indentation, lines up to 100 characters).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
exec .venv/bin/ruff check .

#!/usr/bin/env bash
# Installs jaxrl_sys and runs the main job: a GRPO run on the embedded default
# (one device, in-process rollout, tiny model, synthetic arithmetic task).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
exec .venv/bin/python -m experiments.grpo "$@"

#!/usr/bin/env bash
# One call on a lent GPU (issue 45): the benchmark table (`benchmarks.gpu`, a process per section),
# the decode and train-step profiles (kernels per step, copy share), the portable suite
# (`scripts/gpu_suite.sh`) and the feature rows (decode with unmerged LoRA adapters vs the plain
# model, MoE decode with route capture on vs off, the agentic episodes' idle fraction:
# `benchmarks.gpu_features`), inside GPU_CHECK_BUDGET_S seconds in all (default 270: a second run
# after a fix fits in ~9 minutes), then a compact summary with issue 45's targets met or not.
#
#   bash scripts/gpu_check.sh                        # decode train kernels suite features
#   STAGES="decode train" bash scripts/gpu_check.sh  # some stages only
#   STAGES=tune bash scripts/gpu_check.sh            # the knob sweeps (`benchmarks.gpu --only
#                                                    # tune`: token / backward vocabulary chunks
#                                                    # of the log-probs, gmm tiles), not default
#   GPU_CHECK_ARGS=--quick PYTHON=.venv/bin/python STAGES="decode train" bash scripts/gpu_check.sh
#                                                    # (tiny shapes: a smoke run on a CPU)
#
# Each stage may use what the budget leaves after keeping RESERVE seconds for the stages after
# it; a stage that runs out is interrupted (SIGINT: pytest still prints its counts) and the next
# one starts. The feature rows come last and get what is left: on an H100 with a cold compile
# cache (estimated from the 2026-11-28 run, ~10 s per 0.5B decode compile) decode takes ~65 s,
# train ~80, kernels ~65 and the suite ~60, so features (~60-90 s cold, ~40 warm) may be cut
# (the rows measured so far are kept); `STAGES=features bash scripts/gpu_check.sh` runs them in
# full in a second call.
# JSON: benchmarks/results/gpu_<device>_jax<version>_<UTC stamp>_<section>.json, copied
# with the log and the summary to $OUT when it is set. A rerun on the same (warm) machine reuses
# the compiled programs (JAX_COMPILATION_CACHE_DIR), so it recompiles only what changed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-270}
read -r -a stages <<<"${STAGES:-decode train kernels suite features}"
declare -A RESERVE=([decode]=60 [train]=80 [kernels]=50 [suite]=60 [features]=0 [tune]=0)
export PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxrl_gpu_jax_cache}
stamp=$(date -u +%Y%m%d_%H%M%S)
results=benchmarks/results
mkdir -p "$results"
log=$results/gpu_check_${stamp}.log
suite_log=$results/gpu_check_${stamp}_suite.log
start=$SECONDS
status=()

for stage in "${stages[@]}"; do
  if [ -z "${RESERVE[$stage]+x}" ]; then
    echo "unknown stage '$stage' in STAGES: use decode, train, kernels, features, suite, tune" >&2
    exit 2
  fi
done

nvidia-smi --query-gpu=name,compute_cap,memory.used,memory.total,driver_version \
  --format=csv,noheader 2>&1 | tee -a "$log"

for i in "${!stages[@]}"; do
  stage=${stages[$i]}
  keep=0
  for later in "${stages[@]:$((i + 1))}"; do keep=$((keep + ${RESERVE[$later]:-0})); done
  left=$((BUDGET - (SECONDS - start) - keep))
  if [ "$left" -lt 10 ]; then
    status+=("$stage|skipped|0|out of budget")
    continue
  fi
  t0=$SECONDS
  echo "=== $stage (up to ${left}s) ===" | tee -a "$log"
  if [ "$stage" = suite ]; then
    timeout -s INT -k 15 "$left" bash scripts/gpu_suite.sh -q 2>&1 | tee "$suite_log"
    rc=${PIPESTATUS[0]}
    note=$(grep -E "(passed|failed|error).* in [0-9.]+s" "$suite_log" | tail -1 | tr -d '=')
  else
    profile=()
    case $stage in decode|train) profile=(--profile "/tmp/jaxrl_gpu_trace_$stamp") ;; esac
    # shellcheck disable=SC2086  # GPU_CHECK_ARGS: extra flags, e.g. --quick for a CPU smoke run
    timeout -s INT -k 15 "$left" "$PY" -m benchmarks.gpu --only "$stage" "${profile[@]}" \
      ${GPU_CHECK_ARGS:-} --out "gpu_{device}_jax{jax}_${stamp}_${stage}" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    note=$(grep -c "\"error\"" "$results"/gpu_*_"${stamp}_${stage}".json 2>/dev/null \
           | awk '{print $1 " rows with an error"}')
  fi
  case $rc in 124|137) note="TIMED OUT; $note" ;; esac
  status+=("$stage|$rc|$((SECONDS - t0))|$note")
done

jsons=("$results"/gpu_*_"${stamp}"_*.json)
summary=$results/gpu_check_${stamp}_summary.txt
if [ -e "${jsons[0]}" ]; then
  "$PY" -m benchmarks.gpu_summary "${jsons[@]}" 2>&1 | tee "$summary"
fi
{
  echo "stage    | rc  | seconds | note"
  for row in "${status[@]}"; do
    IFS='|' read -r st rc secs note <<<"$row"
    printf "%-8s | %-3s | %-7s | %s\n" "$st" "$rc" "$secs" "$note"
  done
  echo "total ${SECONDS}s of a ${BUDGET}s budget; results: ${jsons[*]}"
} | tee -a "$summary"
if [ -n "${OUT:-}" ]; then
  cp "$log" "$summary" "$OUT"/
  cp "$suite_log" "${jsons[@]}" "$OUT"/ 2>/dev/null
fi
for row in "${status[@]}"; do    # exit 1 when a stage failed, timed out or was skipped
  IFS='|' read -r _ rc _ _ <<<"$row"
  [ "$rc" = 0 ] || exit 1
done
exit 0

#!/usr/bin/env bash
# The toy tables of docs/benchmarks/llm_entropy_control.md in one command, both toys at
# once in JOBS processes (default 16; on 16 cores about 5 minutes, on 2 about 2 hours).
# Extra controllers (e.g. "lm:kd=6") go in $1. Output: $OUT/letter.txt and vowel.txt
# (or /tmp/llm_tables). On the GPU machine, first `bash benchmarks/gpu_wheels.sh llm`
# here and carry `.whl`.
# LIMIT=540 stops each toy's command after 540 s (the rows done by then are printed).
# Usage (repository root): JOBS=16 bash benchmarks/llm_tables.sh ["lm:kd=6 ..."]
set -uo pipefail
. benchmarks/device_env.sh /tmp/llm_tables
JOBS=${JOBS:-16}
export HF_HUB_OFFLINE=1
extra=${1:-}
# each toy's share of the processes, by its runs (18 and 6 per controller)
n=$(wc -w <<< "$extra")
letter=$(( JOBS * 18 * (3 + n) / (18 * (3 + n) + 6 * (2 + n)) ))
${LIMIT:+timeout $LIMIT} "$PY" benchmarks/llm_entropy_control.py --tasks toy --controllers trl_0.005 trl_0.05 lm \
    $extra --jobs "$letter" 2>&1 | tee "$LOGS/letter.txt" &
${LIMIT:+timeout $LIMIT} "$PY" benchmarks/llm_entropy_control.py --tasks toy --toy_task vowel --toy_target 2.5 \
    --toy_lrs 0.003 0.01 --no_schedule --controllers trl_0.05 lm $extra \
    --jobs $(( JOBS - letter > 0 ? JOBS - letter : 1 )) 2>&1 | tee "$LOGS/vowel.txt" &
wait

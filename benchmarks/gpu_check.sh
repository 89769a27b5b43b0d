#!/usr/bin/env bash
# One short device check for a session that has a GPU (see the device tool), most
# important first, each step under its own time limit (at most 9 minutes in all;
# on an H200 on 2026-12-04, before compile_update: tests 18 s, overhead 18 s,
# sac_k8 113 s, the eager sac_updates 55 s): the CUDA tests (they skip without
# CUDA), the controller benchmark on CUDA, SAC's update speed against SB3's on
# CUDA (eager and compile_update=True, issue 61), SAC K = 8 agents in one process
# against one run on CUDA (issue 42's ratio), and PPO K = 16 agents in one process
# (docs/many_agents.md's K = 64 table takes 5 minutes: `--ks 64`, alone).
# Every step runs even if one before it failed; the exit status says if any did.
# Each step's output also goes to $OUT/<step>.log where $OUT is set.
# Usage: first, here, `bash benchmarks/gpu_wheels.sh` (the packages the GPU
# machine lacks); then run `bash benchmarks/gpu_check.sh` there from the
# repository root with `.whl` carried.
set -uo pipefail
. benchmarks/device_env.sh /tmp/gpu_check
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1
failed=0
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S), limit ${limit} s)"
    timeout "$limit" "$@" 2>&1 | tee "$LOGS/$name.log" || { failed=1; echo "== $name FAILED"; }
}
step tests 80 "$PY" -m pytest -q -o addopts="" -p no:cacheprovider -rs -k cuda tests
step overhead 40 "$PY" benchmarks/controller_overhead.py --device cuda --iters 700
step sac_updates 190 "$PY" benchmarks/sac_speed.py --device cuda --updates_only --rounds 3 \
    --compile_update
step sac_k8 130 "$PY" benchmarks/batched_agents.py --processes --algorithm sac --ks 8 \
    --iterations 1000 --device cuda --jobs 8
step ppo_k16 100 "$PY" benchmarks/batched_agents.py --processes --ks 16 --iterations 10 \
    --device cuda --jobs 16
exit $failed

#!/usr/bin/env bash
# One short device check for a session that has a GPU (see the device tool):
# the CUDA tests (they skip without CUDA), the controller benchmark on CUDA and
# SAC's speed against SB3's on CUDA (issue 9's ratio, never measured on a GPU yet), and
# K = 64 agents in one process on CUDA.
# Every step runs even if one before it failed; the exit status says if any did.
# Usage: first, here, `bash benchmarks/gpu_wheels.sh` (the packages the GPU
# machine lacks); then run `bash benchmarks/gpu_check.sh` there from the
# repository root with `.whl` carried (about 10 minutes).
set -uo pipefail
PY=${PYTHON:-python3}  # the GPU machine's python3 holds torch
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))" || exit 1
failed=0
"$PY" -m pytest -q -o addopts="" -p no:cacheprovider -rs -k cuda tests || failed=1
"$PY" benchmarks/controller_overhead.py --device cuda --iters 700 || failed=1
"$PY" benchmarks/sac_speed.py --device cuda --updates_only || failed=1
"$PY" benchmarks/sac_speed.py --device cuda --seeds 0 1 || failed=1
# 64 PPO agents in one process against one run and 64 runs 16 at a time (the many-agents table).
"$PY" benchmarks/batched_agents.py --processes --ks 64 --iterations 10 --device cuda --jobs 16 || failed=1
exit $failed

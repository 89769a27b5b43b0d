#!/usr/bin/env bash
# One short device check for a session that has a GPU (see the device tool):
# the CUDA tests (they skip without CUDA), the controller benchmark on CUDA and
# SAC's speed against SB3's on CUDA (issue 9's ratio, never measured on a GPU yet).
# Usage (repository root): bash benchmarks/gpu_check.sh
set -euo pipefail
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
python -m pytest -q -o addopts="" -rs -k cuda tests
python benchmarks/controller_overhead.py --device cuda --iters 700
python benchmarks/sac_speed.py --device cuda --seeds 0 1

#!/usr/bin/env bash
# Fetch, here, the wheels that benchmarks/gpu_check.sh needs on the GPU machine.
# That machine (see the device tool) has torch, numpy, pytest, tensorboard and
# tqdm but not these, and cannot download: the wheels travel in .whl/ (git
# ignores it; name it in the run's `carry`). Its Python is 3.12.
# With `llm`, also what the LLM toy needs (benchmarks/llm_tables.sh; the machine
# has huggingface_hub, tokenizers, accelerate, pandas and pyarrow).
# Usage (repository root): bash benchmarks/gpu_wheels.sh [llm]
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl \
    gin-config==0.5.0 gymnasium==1.4.0 farama-notifications==0.0.4 optree==0.20.0 \
    stable-baselines3==2.9.2 \
    ${1:+trl==1.16.0 transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19}
ls .whl

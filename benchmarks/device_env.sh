# Sourced (from the repository root) by gpu_check.sh and llm_tables.sh: installs the
# carried wheels (.whl, from gpu_wheels.sh) where there are any, and sets PY (the GPU
# machine's python3 holds torch), PYTHONPATH, PYTHONUNBUFFERED and LOGS ($OUT, else $1).
PY=${PYTHON:-python3}
LOGS=${OUT:-$1}
mkdir -p "$LOGS"
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1

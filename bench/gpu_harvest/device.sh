#!/bin/bash
# Run on the GPU machine from the repository root (the device tool's working directory), with
# .whl carried: install the wheels, check that cupti-python loads (else take the other version),
# then the harvest. Arguments go to run.py, e.g. `--budget-s 400` or `--jobs a,b`.
#   device tool: command "bash bench/gpu_harvest/device.sh --budget-s 400", carry [".whl"], timeout 580
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if ! python3 -c "from cupti import cupti" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/alt/*.whl
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
python3 bench/gpu_harvest/run.py --device cuda --out /tmp/h --pack "${OUT:?the device tool sets OUT}" "$@" 2>&1 \
  | tee "$OUT/harvest.log"

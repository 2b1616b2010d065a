#!/bin/sh
# Download, on this (networked) machine, the wheels the GPU machine lacks into .whl/ at the
# repository root (git-ignored through .git/info/exclude), and build whatif's own wheel there.
# The device tool then carries .whl (`carry: [".whl"]`); bench/gpu_harvest/device.sh installs it.
# The GPU machine's image has torch 2.11 (CUDA 13), numpy, pandas, pyarrow, networkx and rich;
# the versions below are this project's, for CPython 3.12 on x86-64 (the image's Python).
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >> .git/info/exclude; }
rm -rf .whl && mkdir -p .whl/alt
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q $P -d .whl orjson==3.13.0 msgspec==0.22.0 isal==1.9.1 "cupti-python==13.0.1"
python3 -m pip download -q --no-deps -d .whl plotly==7.1.0 narwhals==2.29.0 pyelftools==0.33
python3 -m pip download -q $P -d .whl/alt "cupti-python==13.4.0"   # if 13.0.1 does not load there
.venv/bin/pip wheel -q --no-deps --no-build-isolation -w .whl .
du -sh .whl

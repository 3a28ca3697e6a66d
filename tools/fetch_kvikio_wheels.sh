#!/bin/sh
# Downloads the KvikIO wheels for the device machine (x86-64, CPython 3.12, CUDA 13) into .whl/ (git-ignored),
# for tools/bench_gpu.py's KvikIO steps there: that machine has torch, cupy, nvidia-ml-py and cuFile but no
# KvikIO and no network, so its wheels travel with the working tree (`carry: [".whl"]`, docs/benchmarks.md).
#
#   sh tools/fetch_kvikio_wheels.sh [DEST]         (default DEST: .whl; KVIKIO_VERSION overrides the release)
#
# kvikio-cu13 is the Python package, libkvikio-cu13 its C++ library, rapids-logger what that one needs; their
# other needs (cupy-cuda13x, numpy, packaging) are on that machine already (checked against the wheels'
# Requires-Dist, 26.6.0). Not run by the tests (they never download).
set -eu
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
VERSION=${KVIKIO_VERSION:-26.6.*}
mkdir -p "$DEST"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "kvikio-cu13==$VERSION" "libkvikio-cu13==$VERSION" "rapids-logger==0.2.*"
ls -l "$DEST"

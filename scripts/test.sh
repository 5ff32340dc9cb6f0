#!/usr/bin/env bash
# Sets up, configures, builds (Release with assertions) and runs every test.
# The CUDA code is always compiled when nvcc exists (sm_90); its tests skip
# without a GPU. Usage: scripts/test.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

echo "== format check (clang-format)"
scripts/format.sh --check

build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure -j"$(nproc)"

#!/usr/bin/env bash
# Sets up, configures, builds (Release with assertions) and runs every test.
# The CUDA code is always compiled when nvcc exists (sm_90); its tests skip
# without a GPU. Usage: scripts/test.sh [--sanitize] [extra cmake args]
#   --sanitize: an AddressSanitizer + UndefinedBehaviorSanitizer build
#   (build-sanitize/, ROFORMER_SANITIZE=ON) of the unit and end-to-end tests.
#   Not run in CI (it doubles the build time); run it before a release.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
if [[ "${1:-}" == "--sanitize" ]]; then
  sanitize=1
  shift
fi

scripts/setup.sh

echo "== format check (clang-format)"
scripts/format.sh --check

build=${BUILD_DIR:-build}
if ((sanitize)); then
  build=${BUILD_DIR:-build-sanitize}
  set -- -DROFORMER_SANITIZE=ON -DROFORMER_WITH_CUDA=OFF -DROFORMER_BUILD_BENCH=OFF "$@"
  # Leaks are checked; a UB report fails the test that triggered it.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure -j"$(nproc)"

#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, a separate clang build in build-fuzz/)
# and runs each for SECONDS, starting from its committed seed corpus
# (fuzz/corpus/<target>). A crash leaves its input in
# build-fuzz/artifacts/<target>/ and makes the script fail; turn it into a
# regression input under fuzz/regressions/<target>/ once fixed (they are
# replayed first, every run). See docs/robustness.md.
# Usage: scripts/fuzz.sh SECONDS [TARGET...]   (PARALLEL=2 runs two at a time;
# FUZZ_SEED=N fixes the random seed)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
targets=("$@")
((${#targets[@]})) || targets=(fuzz_config fuzz_tokenizer fuzz_task_file fuzz_safetensors fuzz_shard fuzz_checkpoint)
build=${FUZZ_BUILD_DIR:-build-fuzz}
parallel=${PARALLEL:-1}

command -v clang++ > /dev/null || { echo "fuzz: clang++ is missing (scripts/setup.sh installs clang)"; exit 1; }
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
# -O1 and line tables only, as libFuzzer's and OSS-Fuzz's builds: the
# sanitized libraries build faster than at -O2 -g, the fuzzers run as many
# inputs a second, and reports still name file and line
# (docs/performance/build-and-ci.md).
opt="-O1 -gline-tables-only"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DROFORMER_FUZZ=ON -DROFORMER_BUILD_TESTS=OFF -DROFORMER_BUILD_BENCH=OFF \
  -DROFORMER_WITH_CUDA=OFF -DROFORMER_NATIVE=OFF "${launcher[@]}" > /dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
run_one() {
  local t=$1 corpus=$build/corpus/$1 artifacts=$build/artifacts/$1/
  mkdir -p "$corpus" "$artifacts"
  cp -n "fuzz/corpus/$t"/* "$corpus"/ 2> /dev/null || true
  if compgen -G "fuzz/regressions/$t/*" > /dev/null; then
    "$build/fuzz/$t" -detect_leaks=0 -runs=0 fuzz/regressions/"$t"/* > "$build/$t.regressions.log" 2>&1 ||
      { echo "fuzz: $t fails a regression input (log: $build/$t.regressions.log)"; return 1; }
  fi
  local status=0 extra=() hdf5=0
  # The Debian libhdf5 (1.10) leaks inside a failing H5Fopen and has memory
  # errors of its own on crafted files (e.g. a heap-use-after-free in
  # H5Aopen: fuzz/hdf5_library_crashes/). Those targets run in fork mode and
  # count crashes instead of stopping at the first; their inputs are kept.
  if [[ $t == fuzz_shard || $t == fuzz_checkpoint ]]; then
    hdf5=1
    extra=(-detect_leaks=0 -fork=1 -ignore_crashes=1)
  fi
  # FUZZ_SEED fixes libFuzzer's random seed (CI does, so a run is reproducible).
  [[ -n ${FUZZ_SEED:-} ]] && extra+=(-seed="$FUZZ_SEED")
  "$build/fuzz/$t" "${extra[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts" -print_final_stats=1 "$corpus" > "$build/$t.log" 2>&1 || status=$?
  local runs crashes=""
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/$t.log" | tail -1)
  if ((hdf5)); then
    runs=$(sed -n 's/^#\([0-9]*\): cov.*/\1/p' "$build/$t.log" | tail -1)
    crashes=", crashes inside libhdf5 (ignored): $(ls "$artifacts" | grep -c '^crash-' || true)"
    status=0
  fi
  echo "fuzz: $t: ${runs:-?} executions in ${seconds} s, corpus $(ls "$corpus" | wc -l) inputs$crashes, exit $status"
  if ((status != 0)); then
    grep -m1 -E "ERROR|==[0-9]+==|deadly signal|Timeout|out-of-memory" "$build/$t.log" || true
    echo "fuzz: $t found a problem: input in $artifacts, log in $build/$t.log"
    return 1
  fi
}
failed=0
running=0
for t in "${targets[@]}"; do
  if ((parallel > 1)); then
    run_one "$t" &
    running=$((running + 1))
    if ((running >= parallel)); then wait -n || failed=1; running=$((running - 1)); fi
  else
    run_one "$t" || failed=1
  fi
done
while ((running > 0)); do wait -n || failed=1; running=$((running - 1)); done
exit $failed

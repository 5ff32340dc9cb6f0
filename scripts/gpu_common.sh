# shellcheck shell=bash
# What the one-call GPU scripts share (scripts/gpu_check.sh, scripts/gpu_bench.sh):
# the sm_90 build and its gpu-pack bundle, unpacking it on the device machine,
# and the step bookkeeping (each step under its own time limit and a common
# budget, logged, recorded in $OUT/summary.txt). Sourced, not run.
#
# A script starts with
#   source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
#   gpu_script_init "${BASH_SOURCE[0]}" "${1:-}"
# and sets, for the steps: OUT, WORK, BUDGET (seconds for all steps together)
# and optionally SUMMARY (the summary file's name under $OUT, summary.txt).

gpu_build_dir=${BUILD_DIR:-build-gpu}

# gpu_script_init SCRIPT MODE: into the repository root, ROOT exported (steps
# run in child bashes), and STEP_LIB set to SCRIPT, which each step's child
# bash sources with MODE __lib to get its functions without running anything.
gpu_script_init() {
  if [[ $2 == __lib ]]; then
    cd "$ROOT" || exit 1
  else
    cd "$(dirname "$1")/.." || exit 1
    export ROOT=$PWD
  fi
  export STEP_LIB=$ROOT/scripts/${1##*/}
}

# gpu_usage SCRIPT: the script's header comment (its usage).
gpu_usage() {
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$1"
}

# gpu_build_and_pack PACK_DIR TARGET...: configures $gpu_build_dir for sm_90
# with the CUDA kernels (benchmarks configured too, so one build directory
# serves both scripts), builds only TARGETs and packs them with gpu-pack into
# PACK_DIR/bundle.tar.xz.
gpu_build_and_pack() {
  set -e
  local pack_dir=$1
  shift
  local pack=${GPU_PACK:-}
  if [[ -z $pack ]]; then
    for candidate in ../shared/tools/gpu-pack /work/shared/tools/gpu-pack; do
      [[ -x $candidate ]] && pack=$candidate && break
    done
  fi
  [[ -n $pack ]] || { echo "gpu-pack not found (set GPU_PACK)" >&2; exit 1; }
  # ccache where the machine has it (a rebuild after a small change is then
  # quick); a fresh machine builds without (and forgets a launcher an earlier
  # configure of this directory recorded).
  local launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_CUDA_COMPILER_LAUNCHER=)
  if command -v ccache > /dev/null; then
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache}
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S . -B "$gpu_build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DROFORMER_WITH_CUDA=ON -DROFORMER_CUDA_KERNELS=ON -DROFORMER_BUILD_BENCH=ON \
    -DROFORMER_NATIVE=OFF "${launcher[@]}"
  grep -q 'ROFORMER_CUDA_KERNELS:BOOL=ON' "$gpu_build_dir/CMakeCache.txt"
  cmake --build "$gpu_build_dir" -j"${JOBS:-2}" --target "$@"
  local stage t
  stage=$(mktemp -d)
  for t in "$@"; do
    find "$gpu_build_dir" -name "$t" -type f -perm -u+x -not -path '*/CMakeFiles/*' -exec cp {} "$stage/" \;
  done
  # Symbols only cost the carry's 64 MiB (the device tool's limit): the copies
  # travel stripped.
  strip --strip-unneeded "$stage"/*
  "$pack" "$stage" "$pack_dir"
  rm -rf "$stage"
  # The test programs read the tree at this absolute path (ROFORMER_SOURCE_DIR,
  # ROFORMER_FIXTURES_DIR): gpu_unpack points it at the device machine's copy.
  echo "$PWD" > "$pack_dir/source_dir"
}

# gpu_unpack PACK_DIR: on the device machine, the bundle's programs and
# libraries onto PATH and LD_LIBRARY_PATH (and the CUDA tools onto PATH).
gpu_unpack() {
  local pack_dir=$1
  [[ -f $pack_dir/bundle.tar.xz ]] || { echo "no $pack_dir/bundle.tar.xz (carry .gpu)"; exit 1; }
  tar xJf "$pack_dir/bundle.tar.xz" -C "$pack_dir"
  # shellcheck disable=SC1091
  source "$pack_dir/gpubundle/env.sh"
  export PATH=$PATH:/usr/local/cuda/bin  # compute-sanitizer, nvcc
  # A library the bundle leaves to the machine (cuBLASLt, NCCL) but env.sh did
  # not find: wherever that machine keeps it (e.g. PyTorch's pip packages).
  local lib found
  for lib in $(ldd "$pack_dir"/gpubundle/bin/* 2> /dev/null | awk '/not found/ {print $1}' | sort -u); do
    found=$(find /usr/local/cuda*/ /opt /usr/lib /usr/local/lib -name "$lib" 2> /dev/null | head -1)
    [[ -n $found ]] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:${found%/*} &&
      echo "gpu_unpack: $lib from $found"
  done
  # cuDNN is opened at run time (core/cuda/cudnn_library.cpp), so ldd does not
  # ask for it: where the loader would not find libcudnn.so.9, add its folder.
  if ! ldconfig -p 2> /dev/null | grep 'libcudnn.so.9 ' > /dev/null; then
    found=$(find /usr/local/cuda*/ /opt /usr/lib /usr/local/lib -name libcudnn.so.9 2> /dev/null | head -1)
    [[ -n $found ]] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:${found%/*} &&
      echo "gpu_unpack: libcudnn.so.9 from $found"
  fi
  local built_in root=${ROOT:-$PWD}  # bench/gpu/attention_table.sh sets no ROOT
  built_in=$(cat "$pack_dir/source_dir" 2> /dev/null || true)
  if [[ -n $built_in && $built_in != "$root" && ! -e $built_in ]]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$root" "$built_in" &&
      echo "gpu_unpack: $built_in (the build's source path) -> $root"
  fi
}

# gpu_dry_path: here, the programs of $gpu_build_dir onto PATH in place of the bundle's.
gpu_dry_path() {
  local build=$gpu_build_dir dirs
  [[ $build == /* ]] || build=$ROOT/$build
  dirs=$(find "$build/tests" "$build/bench" -type d 2>/dev/null | tr '\n' ':')
  export PATH=$build:$dirs$PATH
}

# The system interpreter has torch and h5py here (Debian), not transformers.
gpu_dry_python() {
  [[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3
}

# --- bookkeeping ----------------------------------------------------------------------

failed=0
start_time=$SECONDS
summary() { echo "$*" | tee -a "$OUT/${SUMMARY:-summary.txt}"; }
note() { echo "$*" >> "$WORK/notes.txt"; }  # a step's key numbers, shown after its line
pack_logs() { tar czf "$OUT/logs.tar.gz" -C "$WORK" --exclude='*.h5' --exclude='shards' . 2>/dev/null; }

# Seconds left of the budget (a margin kept for packing the logs).
budget_left() { echo $((BUDGET - (SECONDS - start_time) - 15)); }

# GPU_STEPS="a b": run only the steps named (a second look at a few, in less device time).
step() {  # step NAME SECONDS FUNCTION [ARGS]: runs under a time limit, logs, records the result
  local name=$1 limit=$2
  shift 2
  [[ -n ${GPU_STEPS:-} && " $GPU_STEPS " != *" $name "* ]] && return
  local left
  left=$(budget_left)
  if ((left < 20)); then
    summary "SKIP  $name (the ${BUDGET} s budget is spent)"
    return
  fi
  ((limit > left)) && limit=$left
  : > "$WORK/notes.txt"
  local t0=$SECONDS rc=0
  # A function runs in a child bash so `timeout` can stop it with everything it started.
  timeout --kill-after=10 "$limit" bash -c "source '${STEP_LIB:?}' __lib; $*" \
    > "$WORK/$name.log" 2>&1 || rc=$?
  local took=$((SECONDS - t0))
  if ((rc == 0)); then
    summary "ok    $name (${took} s)"
  elif ((rc == 77)); then
    summary "SKIP  $name (${took} s): $(tail -n 1 "$WORK/$name.log")"
  else
    ((rc == 124 || rc == 137)) && echo "stopped at its ${limit} s limit" >> "$WORK/$name.log"
    summary "FAIL  $name (${took} s, exit $rc): tail of $name.log"
    tail -n 12 "$WORK/$name.log" | sed 's/^/      /' | tee -a "$OUT/${SUMMARY:-summary.txt}"
    failed=$((failed + 1))
  fi
  [[ -s $WORK/notes.txt ]] && sed 's/^/      /' "$WORK/notes.txt" | tee -a "$OUT/${SUMMARY:-summary.txt}"
  pack_logs
}

# The device step both scripts start with: GPU, driver, nvcc and Python packages.
device_info() {
  nvidia-smi || true
  nvcc --version 2>/dev/null | tail -1 || true
  $PYTHON - <<'PY' || true
import importlib
for name in ("torch", "transformers", "h5py", "numpy"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "missing:", e)
try:
    import torch
    print("cuda device:", torch.cuda.get_device_name(0))
except Exception as e:  # noqa: BLE001
    print("torch.cuda:", e)
PY
  local gpu
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $gpu ]] && note "$gpu"
  return 0
}

#!/usr/bin/env bash
# The whole GPU check of the CUDA backend (issue 13), in two halves:
#
#   scripts/gpu_check.sh build     here (no GPU needed): configure for sm_90 with
#                                  the CUDA kernels, build the CLI and the test
#                                  binaries into build-gpu/, pack them with
#                                  gpu-pack into .gpu/bundle.tar.xz
#   scripts/gpu_check.sh run       on the GPU machine, from the repository root:
#                                  unpack, then run every check below, writing
#                                  logs and files to commit under $OUT
#
# The one device call (the device tool copies the working tree; .gpu/ is
# ignored, so it must be carried):
#
#   run(command="scripts/gpu_check.sh run", carry=[".gpu"], timeout_s=600)
#
# What `run` does, each step logged to $OUT/<step>.log and summarised in
# $OUT/summary.txt (the reply's tail shows the summary):
#   1. nvidia-smi and the CUDA runtime's view of the device;
#   2. cuda_tests: the backend (copies, streams, caching allocator, pinned
#      uploads), cuBLASLt GEMMs, fused AdamW and grad-norm against host
#      references, Philox on the device, and every op on CUDA against the CPU
#      (forward and backward, strided inputs, poisoned memory, bf16);
#   3. op_table_tests (every op x dtype x device against f64 on the CPU), when
#      the build has them;
#   4. compute-sanitizer --tool memcheck over the CUDA op tests (the GPU-only
#      cases; the skipped ones would prove nothing);
#   5. end to end: a small model pretrained for 100 steps on the CPU and on the
#      GPU from the same config; the two loss curves are compared
#      (f32: 1e-4 relative on the first loss, 2e-2 on every logged one);
#   6. the model goldens regenerated with transformers (tests/golden/*.py) into
#      $OUT/fixtures, to commit when they differ.
# A step that fails does not stop the later ones; the exit code is the number
# of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
build_dir=${BUILD_DIR:-build-gpu}
pack_dir=.gpu

build() {
  set -e
  local pack=${GPU_PACK:-}
  if [[ -z $pack ]]; then
    for candidate in ../shared/tools/gpu-pack /work/shared/tools/gpu-pack; do
      [[ -x $candidate ]] && pack=$candidate && break
    done
  fi
  [[ -n $pack ]] || { echo "gpu_check: gpu-pack not found (set GPU_PACK)" >&2; exit 1; }
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache}
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DROFORMER_WITH_CUDA=ON -DROFORMER_CUDA_KERNELS=ON -DROFORMER_BUILD_BENCH=OFF \
    -DROFORMER_NATIVE=OFF -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
  grep -q 'ROFORMER_CUDA_KERNELS:BOOL=ON' "$build_dir/CMakeCache.txt"
  local targets=(roformer cuda_tests core_tests)
  grep -q 'op_table_tests' "$build_dir/Makefile" 2>/dev/null && targets+=(op_table_tests)
  cmake --build "$build_dir" -j"${JOBS:-2}" --target "${targets[@]}"
  # Only the programs the check runs: the bundle must stay small.
  local stage
  stage=$(mktemp -d)
  for t in "${targets[@]}"; do find "$build_dir" -name "$t" -type f -perm -u+x -exec cp {} "$stage/" \;; done
  "$pack" "$stage" "$pack_dir"
  rm -rf "$stage"
  echo "gpu_check: built for sm_90 and packed into $pack_dir/bundle.tar.xz; now, on the GPU machine:"
  echo '  run(command="scripts/gpu_check.sh run", carry=[".gpu"], timeout_s=600)'
}

failed=0
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
step() {  # step NAME COMMAND...: runs, logs, records ok/FAIL and the time
  local name=$1
  shift
  local start=$SECONDS
  if "$@" > "$OUT/$name.log" 2>&1; then
    summary "ok    $name ($((SECONDS - start)) s)"
  else
    summary "FAIL  $name ($((SECONDS - start)) s, exit $?): tail of $name.log"
    tail -n 15 "$OUT/$name.log" | sed 's/^/      /' | tee -a "$OUT/summary.txt"
    failed=$((failed + 1))
  fi
}

device_info() {
  nvidia-smi
  nvcc --version 2>/dev/null | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' 2>/dev/null || true
}

end_to_end() {
  local work=$OUT/e2e
  mkdir -p "$work"
  cat > "$work/t.yaml" <<YAML
run: {dir: $work/run-DEVICE, seed: 7, threads: 8, precision: f32}
model: {vocab_size: 30522, hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 512, max_position_embeddings: 128}
data: {vocab: $PWD/tests/fixtures/bert-base-uncased-vocab.txt, inputs: ["$PWD/tests/fixtures/corpus/*/*.txt"], shard_dir: $work/shards, validation_fraction: 0.1}
optim: {lr: 5.0e-4}
stages: [{max_seq_len: 64, batch_size: 8, steps: 50}, {max_seq_len: 128, batch_size: 4, steps: 50}]
checkpoint: {every_steps: 0}
log: {every_steps: 1, eval_every_steps: 0, progress: never}
YAML
  roformer prepare --config "$work/t.yaml" || return 1
  for device in cpu cuda; do
    sed "s/DEVICE/$device/" "$work/t.yaml" > "$work/$device.yaml"
    roformer pretrain --config "$work/$device.yaml" run.device=$device > "$work/$device.out" 2>&1 ||
      { tail -20 "$work/$device.out"; return 1; }
  done
  python3 - "$work/run-cpu/metrics.jsonl" "$work/run-cuda/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    # The exact loss of each logged step (log.every_steps: 1).
    return [float(r["last_step_loss"]) for r in map(json.loads, open(path)) if r.get("type") == "train"]
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
assert len(cpu) == len(gpu) > 0, f"{len(cpu)} CPU and {len(gpu)} GPU steps logged"
rel = [abs(g - c) / abs(c) for c, g in zip(cpu, gpu)]
print(f"steps {len(cpu)}; first loss cpu {cpu[0]:.6f} gpu {gpu[0]:.6f}; max relative difference {max(rel):.2e}")
assert rel[0] < 1e-4, f"first loss differs by {rel[0]:.2e} (limit 1e-4)"
assert max(rel) < 2e-2, f"a logged loss differs by {max(rel):.2e} (limit 2e-2)"
PY
}

regenerate_goldens() {
  # The model goldens made by transformers itself (the machine has PyTorch
  # and transformers); each script says which reference made its file.
  mkdir -p "$OUT/fixtures"
  python3 tests/golden/make_golden_roformer.py --out-dir "$OUT/fixtures" || return 1
  if [[ -f tests/golden/make_golden_train10.py ]]; then
    python3 tests/golden/make_golden_train10.py --out "$OUT/fixtures/golden_train10.h5" || return 1
  fi
  ls -l "$OUT/fixtures"
}

run_checks() {
  : "${OUT:?gpu_check run: \$OUT (the device tool output folder) is not set}"
  [[ -f $pack_dir/bundle.tar.xz ]] || { echo "gpu_check: no $pack_dir/bundle.tar.xz (carry .gpu)"; exit 1; }
  tar xJf "$pack_dir/bundle.tar.xz" -C "$pack_dir"
  # shellcheck disable=SC1091
  source "$pack_dir/gpubundle/env.sh"
  export PATH=$PATH:/usr/local/cuda/bin  # compute-sanitizer, nvcc
  : > "$OUT/summary.txt"
  step device device_info
  step cuda_tests cuda_tests --gtest_output="xml:$OUT/cuda_tests.xml"
  if command -v op_table_tests >/dev/null; then
    step op_table op_table_tests --gtest_output="xml:$OUT/op_table.xml"
  fi
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 --leak-check full \
    cuda_tests --gtest_filter='CudaOps.*:CudaOptimizer.*:CudaGemm*:CudaPhilox.*'
  step end_to_end end_to_end
  step goldens regenerate_goldens
  summary "gpu_check: $failed step(s) failed; logs in $OUT"
  exit "$failed"
}

case $mode in
  build) build ;;
  run) run_checks ;;
  *)
    sed -n '2,33p' "$0"
    exit 2
    ;;
esac

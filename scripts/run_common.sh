# Sourced by scripts/run.sh and scripts/run_zh.sh: the phases both demos share.

# phase NAME: a heading with the time, so a long run shows where it is.
phase() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

# setup_and_build [SETUP_ARGS...]: installs the Debian packages
# (scripts/setup.sh SETUP_ARGS) and builds the Release `roformer` in
# build-run/; sets $roformer to it. The CUDA kernels are only built where a
# GPU can run them (the test command always compiles them).
setup_and_build() {
  phase "set-up: Debian packages"
  scripts/setup.sh "$@"

  phase "build (Release)"
  local cuda=OFF
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; fi
  cmake -S . -B build-run -DCMAKE_BUILD_TYPE=Release -DROFORMER_WITH_CUDA=$cuda \
    -DROFORMER_BUILD_TESTS=OFF -DROFORMER_BUILD_BENCH=OFF >/dev/null
  cmake --build build-run -j"$(nproc)" --target roformer
  roformer=build-run/roformer
}

# config_value SECTION KEY CONFIG [OVERRIDES...]: one value of the resolved
# config (`roformer config` prints it as YAML), e.g. config_value run dir ...
config_value() {
  local section=$1 key=$2
  shift 2
  $roformer config --config "$@" |
    awk -v s="$section:" -v k="  $key:" '$0 == s {in_s = 1; next} /^[^ ]/ {in_s = 0} in_s && index($0, k) == 1 {print $2; exit}'
}

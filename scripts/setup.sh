#!/usr/bin/env bash
# Installs the Debian packages the build needs: only what is missing, quietly,
# safe to run again. Usage: scripts/setup.sh [--python] [--zh]  (--python adds
# the CPU PyTorch peer used by the benchmarks and golden-file scripts; --zh
# what the Chinese demo needs: python3-jieba's dictionary for the jieba
# pre-tokenizer, opencc and fortunes-zh for scripts/fetch_data_zh.sh)
set -euo pipefail

packages=(build-essential cmake pkg-config git ca-certificates xz-utils
  libdnnl-dev ocl-icd-opencl-dev libhdf5-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev libutf8proc-dev
  libopenmpi-dev openmpi-bin clang-format gnuplot-nox clang)
if ! command -v npm >/dev/null 2>&1; then packages+=(npm); fi
for arg in "$@"; do
  case $arg in
    --python) packages+=(python3 python3-numpy python3-h5py python3-torch libopenblas0-pthread) ;;
    --zh) packages+=(python3-jieba opencc fortunes-zh) ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all build dependencies present"

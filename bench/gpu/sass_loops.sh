#!/usr/bin/env bash
# The inner loops of our CUDA kernels as the GPU runs them (SASS), counted
# without a GPU: bench/gpu/sass_loops.sh [BUILD_DIR] [SOURCE...]
#
# Compiles each source (default: the flash attention forward and backward)
# to an sm_90 cubin (sm_90a for the *wgmma* files) with the flags BUILD_DIR's
# compile_commands.json gives it (a build configured with
# -DCMAKE_CUDA_ARCHITECTURES=90; default: build), disassembles it, and prints
# per kernel loop its instructions, HMMA and MUFU counts and instructions per
# HMMA (bench/gpu/sass_loops.py), ptxas's registers and spills, and its
# warnings that it serialized wgmma. Listings go to $SASS_OUT (default
# BUILD_DIR/sass).
#
# The CUDA 13 toolkit here ships no disassembler (no cuobjdump, no
# nvdisasm). Debian's non-free nvidia-cuda-toolkit (11.8) has nvdisasm; the
# script downloads that package once into ~/.cache/roformer-nvdisasm with a
# private apt source list (the system's lists are not touched), or uses
# $NVDISASM. CUDA 11.8's nvdisasm reads sm_90 code but not the newer cubin
# header (ELF ABI 8 keeps the SM in another field of e_flags), so the script
# rewrites a copy's header into the ABI 7 form (same code) before listing.
# It also leaves out the few sm_90 instructions it cannot decode (about 2-3%
# of the attention loops, with their labels): counts read a little low, and
# compare with each other.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1:-build}
shift || true
sources=("$@")
((${#sources[@]})) || sources=(core/cuda/kernels/flash_attention.cu
  core/cuda/kernels/flash_attention_backward.cu)
out=${SASS_OUT:-$build/sass}
mkdir -p "$out"

find_nvdisasm() {
  if [[ -n ${NVDISASM:-} ]]; then
    echo "$NVDISASM"
    return
  fi
  for c in /usr/local/cuda/bin/nvdisasm "$HOME/.cache/roformer-nvdisasm/usr/bin/nvdisasm"; do
    if [[ -x $c ]]; then
      echo "$c"
      return
    fi
  done
  local cache=$HOME/.cache/roformer-nvdisasm apt=$HOME/.cache/roformer-nvdisasm/apt
  mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/etc"
  cat >"$apt/etc/nonfree.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  local opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt/etc"
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt" -o "APT::Sandbox::User=root")
  echo "sass_loops: fetching nvdisasm (Debian non-free nvidia-cuda-toolkit, ~84 MB)" >&2
  apt-get "${opts[@]}" update -qq >&2
  (cd "$apt/archives" && apt-get "${opts[@]}" download nvidia-cuda-toolkit >&2)
  dpkg -x "$apt"/archives/nvidia-cuda-toolkit_*.deb "$cache/x"
  mkdir -p "$cache/usr/bin"
  mv "$cache/x/usr/bin/nvdisasm" "$cache/usr/bin/nvdisasm"
  rm -rf "$cache/x" "$apt/archives"/*.deb
  echo "$cache/usr/bin/nvdisasm"
}

nvdisasm=$(find_nvdisasm)
for src in "${sources[@]}"; do
  name=$(basename "$src" .cu)
  # The file's nvcc command from the build, turned into an sm_90 cubin build.
  cmd=$(python3 - "$build/compile_commands.json" "$PWD/$src" <<'PY'
import json, shlex, sys
for entry in json.load(open(sys.argv[1])):
    if entry['file'] == sys.argv[2]:
        words = shlex.split(entry['command'])
        keep, skip = [], False
        for w in words:
            if skip:
                skip = False
                continue
            if w in ('-c', '-o'):
                skip = w == '-o'
                continue
            if w.startswith('--generate-code') or w == sys.argv[2]:
                continue
            keep.append(w)
        print('cd %s && %s' % (shlex.quote(entry['directory']), shlex.join(keep)))
        break
PY
)
  [[ -n $cmd ]] || {
    echo "sass_loops: $src is not in $build/compile_commands.json (configure with ROFORMER_CUDA)" >&2
    exit 1
  }
  cubin=$PWD/$out/$name.cubin
  # The wgmma kernels exist for sm_90a alone (their object library's arch).
  arch=sm_90
  [[ $name == *wgmma* ]] && arch=sm_90a
  if ! (eval "$cmd -arch=$arch -cubin -Xptxas -v -o $cubin $PWD/$src") 2>"$out/$name.ptxas"; then
    cat "$out/$name.ptxas" >&2
    echo "sass_loops: $src did not compile" >&2
    exit 1
  fi
  python3 - "$cubin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
if b[8] >= 8:  # ELF ABI 8: e_flags 0x..SS.. -> ABI 7: SM | 0x500 | virtual SM << 16
    sm = (struct.unpack_from('<I', b, 48)[0] >> 8) & 0xff
    b[8] = 7
    struct.pack_into('<I', b, 48, sm | 0x500 | (sm << 16))
open(sys.argv[1] + '.abi7', 'wb').write(b)
PY
  "$nvdisasm" -c "$cubin.abi7" >"$out/$name.sass"
  echo "== $src ($arch; listing $out/$name.sass)"
  python3 bench/gpu/sass_loops.py "$out/$name.sass" --ptxas "$out/$name.ptxas"
  # ptxas's warnings that it serialized wgmma (a wgmma in a branch, say): the
  # kernel stays correct but each product waits for the one before.
  grep -o "(C75[0-9]*) Potential Performance Loss: [^']*" "$out/$name.ptxas" | sort -u |
    sed 's/^/  ptxas: /' || true
done

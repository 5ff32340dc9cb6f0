// The bodies of the data commands of the `roformer` CLI:
//   roformer prepare --config FILE [--build-vocab SIZE]   text -> HDF5 shards
//   roformer tokenize --vocab FILE [--json]               stdin lines -> ids
//   roformer inspect SHARD                                 (describe_shard)
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "data/masking.h"
#include "data/tokenizer.h"

namespace roformer::data {

// Mirrors the `data:` section of the YAML config (same key names); the last
// group of fields are command-line or programmatic knobs.
struct PrepareOptions {
  std::string vocab;  // vocab.txt (written there first when build_vocab > 0)
  bool lowercase = true;
  PreTokenizer pre_tokenizer = PreTokenizer::none;
  std::string jieba_dict;             // "" = Jieba::default_dict_path()
  std::vector<std::string> inputs;    // paths or glob patterns
  std::string input_format = "text";  // text | jsonl
  std::string jsonl_field = "text";
  std::string shard_dir;
  double validation_fraction = 0.01;
  uint64_t split_seed = 0;
  std::string invalid_utf8 = "error";  // error | replace

  // > 0: learn a vocab of this size from the inputs (WordPiece; with jieba a
  // word + character vocab, data/vocab_builder.h)
  int64_t build_vocab = 0;
  int threads = 0;       // 0: all cores
  bool progress = true;  // a progress bar, only when stderr is a terminal
  int64_t max_shard_tokens = int64_t(1) << 28;
  bool force = false;  // rebuild even when the shards are up to date
};

struct PrepareResult {
  bool up_to_date = false;  // nothing was done: the shards match inputs and options
  std::string fingerprint;
  std::vector<std::string> train_shards, validation_shards;
  int64_t files = 0, documents = 0, train_documents = 0, validation_documents = 0;
  int64_t train_tokens = 0, validation_tokens = 0;
  double seconds = 0;
};

// Tokenizes the inputs (files in parallel), splits the documents into train
// and validation by a seeded shuffle, and writes shards `train-NNNNN.h5` and
// `validation-NNNNN.h5` plus `manifest.json` to shard_dir, each atomically.
// Re-running with unchanged inputs and options does nothing.
PrepareResult run_prepare(const PrepareOptions& options);

// Shard paths of `split` ("train" | "validation") listed by shard_dir's
// manifest.json; InputError when the directory holds no finished prepare run.
std::vector<std::string> list_shards(const std::string& shard_dir, const std::string& split);

// The fingerprint run_prepare stores: input paths, sizes and contents, the
// vocab's identity, the pre-tokenizer (Tokenizer::pre_tokenizer_identity)
// and every option that changes the shards.
std::string prepare_fingerprint(const PrepareOptions& options,
                                const std::vector<std::string>& files,
                                const TokenizerIdentity& tokenizer,
                                const std::string& pre_tokenizer = "none");

struct TokenizeStreamOptions {
  bool json = false;                // one JSON object per line: {"ids": [...], "tokens": [...]}
  bool add_special_tokens = false;  // [CLS] ... [SEP]
};

// Reads lines from `in` and writes their ids (space separated) or JSON to
// `out`. Invalid UTF-8 is an InputError naming the line and byte.
void tokenize_stream(std::istream& in, std::ostream& out, const Tokenizer& tokenizer,
                     const TokenizeStreamOptions& options = {});

}  // namespace roformer::data

// Corpus shards: one HDF5 file holding a flat token array and document
// offsets, with the tokenizer's identity and enough metadata to verify the file
// when it is opened. Layout (docs/formats.md, "Corpus shards"):
//   /tokens       uint16 (vocab <= 65536) or uint32 [num_tokens], chunked, deflate
//   /doc_offsets  uint64 [num_documents + 1]; document i is tokens[off[i], off[i+1])
//   root attributes: format, format_version, split, num_tokens, num_documents,
//     vocab_hash, vocab_size, lowercase, strip_accents, tokenize_chinese_chars,
//     tokenizer, sources (JSON array), fingerprint, tokens_checksum, created_by,
//     shard_index, num_shards
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace roformer::data {

inline constexpr const char* kShardFormat = "roformer-corpus-shard";
inline constexpr int64_t kShardFormatVersion = 1;

struct ShardInfo {
  std::string path;
  int64_t format_version = kShardFormatVersion;
  std::string split;  // "train" | "validation"
  TokenizerIdentity tokenizer;
  std::string token_dtype;  // "uint16" | "uint32"
  int64_t num_tokens = 0;
  int64_t num_documents = 0;
  std::vector<std::string> sources;  // input files the documents came from
  std::string fingerprint;           // of inputs + options (see prepare.h)
  std::string tokens_checksum;       // FNV-1a 64 over the ids as little-endian uint32
  std::string created_by;
  int64_t shard_index = 0, num_shards = 1;
};

// FNV-1a 64 (hex) over `tokens` as little-endian uint32 values.
std::string tokens_checksum(std::span<const uint32_t> tokens);

// Writes a shard atomically (temp name + flush + fsync + rename). Counts,
// dtype and checksum are derived from the arrays; the rest comes from `info`.
void write_shard(const std::string& path, const ShardInfo& info, std::span<const uint32_t> tokens,
                 std::span<const uint64_t> doc_offsets);

// The attributes only, without reading or verifying the arrays.
ShardInfo read_shard_info(const std::string& path);

class Shard {
 public:
  // Opens and verifies a shard: format and version, the token and document
  // counts against the arrays, offsets (from 0, increasing, ending at
  // num_tokens), ids below vocab_size and the checksum. With `expected`, a
  // shard made by a different tokenizer (vocab or options) is refused with a
  // message naming both. All failures are InputErrors naming the file.
  static Shard open(const std::string& path, const TokenizerIdentity* expected = nullptr);

  const ShardInfo& info() const { return info_; }
  const std::string& path() const { return info_.path; }
  std::span<const uint32_t> tokens() const { return tokens_; }
  std::span<const uint64_t> doc_offsets() const { return offsets_; }
  int64_t num_documents() const { return int64_t(offsets_.size()) - 1; }
  int64_t num_tokens() const { return int64_t(tokens_.size()); }
  std::span<const uint32_t> document(int64_t i) const {
    return std::span<const uint32_t>(tokens_).subspan(
        offsets_[size_t(i)], offsets_[size_t(i) + 1] - offsets_[size_t(i)]);
  }

 private:
  ShardInfo info_;
  std::vector<uint32_t> tokens_;
  std::vector<uint64_t> offsets_;
};

// A human-readable summary (`roformer inspect SHARD`): counts, dtype, document
// lengths, sequences per max_seq_len, tokenizer identity, sources, checksum
// status. Verifies the shard.
std::string describe_shard(const std::string& path);

}  // namespace roformer::data

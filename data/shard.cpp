#include "data/shard.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/hash.h"
#include "data/hdf5.h"

namespace roformer::data {

std::string tokens_checksum(std::span<const uint32_t> tokens) {
  Fnv1a64 h;
  unsigned char buf[4096];
  size_t fill = 0;
  for (uint32_t t : tokens) {  // explicit little-endian bytes
    buf[fill++] = uint8_t(t);
    buf[fill++] = uint8_t(t >> 8);
    buf[fill++] = uint8_t(t >> 16);
    buf[fill++] = uint8_t(t >> 24);
    if (fill == sizeof buf) {
      h.update(buf, fill);
      fill = 0;
    }
  }
  h.update(buf, fill);
  return h.hex();
}

void write_shard(const std::string& path, const ShardInfo& info, std::span<const uint32_t> tokens,
                 std::span<const uint64_t> doc_offsets) {
  RF_CHECK(!doc_offsets.empty() && doc_offsets.front() == 0 && doc_offsets.back() == tokens.size(),
           "write_shard ", path, ": document offsets do not cover the token array");
  const bool narrow = info.tokenizer.vocab_size <= 65536;
  hdf5::AtomicFile out(path);
  auto& root = out.root();
  hdf5::DatasetOptions opts;
  opts.chunk = 1 << 18;
  if (narrow) {
    std::vector<uint16_t> narrow_tokens(tokens.begin(), tokens.end());
    root.write_dataset<uint16_t>("tokens", narrow_tokens, opts);
  } else {
    root.write_dataset<uint32_t>("tokens", tokens, opts);
  }
  opts.chunk = 1 << 14;
  root.write_dataset<uint64_t>("doc_offsets", doc_offsets, opts);

  root.set_attr("format", kShardFormat);
  root.set_attr("format_version", kShardFormatVersion);
  root.set_attr("split", info.split);
  root.set_attr("num_tokens", int64_t(tokens.size()));
  root.set_attr("num_documents", int64_t(doc_offsets.size() - 1));
  root.set_attr("token_dtype", narrow ? "uint16" : "uint32");
  root.set_attr("vocab_hash", info.tokenizer.vocab_hash);
  root.set_attr("vocab_size", info.tokenizer.vocab_size);
  root.set_attr("lowercase", int64_t(info.tokenizer.lowercase));
  root.set_attr("strip_accents", int64_t(info.tokenizer.strip_accents));
  root.set_attr("tokenize_chinese_chars", int64_t(info.tokenizer.tokenize_chinese_chars));
  root.set_attr("tokenizer", "bert-wordpiece: " + info.tokenizer.describe());
  root.set_attr("sources", nlohmann::json(info.sources).dump());
  root.set_attr("fingerprint", info.fingerprint);
  root.set_attr("tokens_checksum", tokens_checksum(tokens));
  root.set_attr("created_by", info.created_by.empty() ? "roformer prepare" : info.created_by);
  root.set_attr("shard_index", info.shard_index);
  root.set_attr("num_shards", info.num_shards);
  out.commit();
}

namespace {

ShardInfo read_info(const hdf5::File& file) {
  const auto& root = file.root();
  const std::string& path = file.path();
  ShardInfo info;
  info.path = path;
  try {
    RF_INPUT_CHECK(root.has_attr("format") && root.attr_string("format") == kShardFormat, "'", path,
                   "' is not a roformer corpus shard (no format=", kShardFormat, " attribute)");
    info.format_version = root.attr<int64_t>("format_version");
    RF_INPUT_CHECK(info.format_version == kShardFormatVersion, "shard '", path,
                   "' has format version ", info.format_version, "; this build reads version ",
                   kShardFormatVersion, " (re-run roformer prepare)");
    info.split = root.attr_string("split");
    info.num_tokens = root.attr<int64_t>("num_tokens");
    info.num_documents = root.attr<int64_t>("num_documents");
    info.token_dtype = root.attr_string("token_dtype");
    info.tokenizer.vocab_hash = root.attr_string("vocab_hash");
    info.tokenizer.vocab_size = root.attr<int64_t>("vocab_size");
    info.tokenizer.lowercase = root.attr<int64_t>("lowercase") != 0;
    info.tokenizer.strip_accents = root.attr<int64_t>("strip_accents") != 0;
    info.tokenizer.tokenize_chinese_chars = root.attr<int64_t>("tokenize_chinese_chars") != 0;
    info.sources =
        nlohmann::json::parse(root.attr_string("sources")).get<std::vector<std::string>>();
    info.fingerprint = root.attr_string("fingerprint");
    info.tokens_checksum = root.attr_string("tokens_checksum");
    info.created_by = root.attr_string("created_by");
    info.shard_index = root.attr<int64_t>("shard_index");
    info.num_shards = root.attr<int64_t>("num_shards");
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError("shard '" + path + "' has missing or unreadable metadata: " + e.what());
  }
  return info;
}

}  // namespace

ShardInfo read_shard_info(const std::string& path) {
  const hdf5::File file = hdf5::File::open(path);
  return read_info(file);
}

Shard Shard::open(const std::string& path, const TokenizerIdentity* expected) {
  const hdf5::File file = hdf5::File::open(path);
  Shard s;
  s.info_ = read_info(file);
  const ShardInfo& info = s.info_;
  if (expected && !(info.tokenizer == *expected))
    throw InputError("shard '" + path + "' was made with tokenizer {" + info.tokenizer.describe() +
                     "} but this run uses {" + expected->describe() +
                     "}; re-run roformer prepare with this vocab and options");
  auto bad = [&](const std::string& what) {
    return InputError("shard '" + path + "' is corrupt or truncated: " + what);
  };
  try {
    const auto& root = file.root();
    const hdf5::Dataset tokens = root.open_dataset("tokens");
    const hdf5::Dataset offsets = root.open_dataset("doc_offsets");
    if (tokens.size() != info.num_tokens)
      throw bad("/tokens holds " + std::to_string(tokens.size()) + " ids, num_tokens says " +
                std::to_string(info.num_tokens));
    if (offsets.size() != info.num_documents + 1)
      throw bad("/doc_offsets holds " + std::to_string(offsets.size()) +
                " entries, expected num_documents + 1 = " + std::to_string(info.num_documents + 1));
    s.tokens_ = tokens.read<uint32_t>();
    s.offsets_ = offsets.read<uint64_t>();
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  const auto& off = s.offsets_;
  if (off.front() != 0) throw bad("the first document offset is " + std::to_string(off.front()));
  for (size_t i = 1; i < off.size(); ++i)
    if (off[i] <= off[i - 1])
      throw bad("document offsets are not increasing at document " + std::to_string(i - 1));
  if (off.back() != uint64_t(info.num_tokens))
    throw bad("the last document ends at " + std::to_string(off.back()) + ", not at num_tokens " +
              std::to_string(info.num_tokens));
  const std::string sum = tokens_checksum(s.tokens_);
  if (sum != info.tokens_checksum)
    throw bad("token checksum " + sum + " differs from the recorded " + info.tokens_checksum);
  const uint32_t limit = uint32_t(info.tokenizer.vocab_size);
  for (size_t i = 0; i < s.tokens_.size(); ++i)
    if (s.tokens_[i] >= limit)
      throw bad("token " + std::to_string(i) + " has id " + std::to_string(s.tokens_[i]) +
                " >= vocab_size " + std::to_string(limit));
  return s;
}

std::string describe_shard(const std::string& path) {
  const Shard shard = Shard::open(path);
  const ShardInfo& info = shard.info();
  std::ostringstream out;
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  out << "corpus shard " << path << "\n";
  out << "  format          " << kShardFormat << " v" << info.format_version << " (verified: "
      << "counts, offsets, ids < vocab_size, checksum " << info.tokens_checksum << ")\n";
  out << "  split           " << info.split << " (shard " << info.shard_index + 1 << " of "
      << info.num_shards << ")\n";
  out << "  tokens          " << info.num_tokens << " (" << info.token_dtype << ")";
  if (!ec && bytes > 0)
    out << ", file " << bytes
        << " bytes = " << double(bytes) / double(std::max<int64_t>(1, info.num_tokens))
        << " bytes/token";
  out << "\n";
  out << "  documents       " << info.num_documents;
  if (info.num_documents > 0) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int64_t i = 0; i < shard.num_documents(); ++i) {
      const uint64_t n = shard.document(i).size();
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    out << " (tokens per document: min " << lo << ", mean "
        << double(info.num_tokens) / double(info.num_documents) << ", max " << hi << ")";
  }
  out << "\n  sequences       ";
  for (int64_t len : {128, 512, 1536}) {
    int64_t n = 0;
    for (int64_t i = 0; i < shard.num_documents(); ++i)
      n += (int64_t(shard.document(i).size()) + len - 3) / (len - 2);
    out << n << " at max_seq_len " << len << (len == 1536 ? "\n" : ", ");
  }
  out << "  tokenizer       " << info.tokenizer.describe() << "\n";
  out << "  fingerprint     " << info.fingerprint << "\n";
  out << "  created by      " << info.created_by << "\n";
  out << "  sources         " << info.sources.size() << " file(s)";
  for (size_t i = 0; i < info.sources.size() && i < 5; ++i) out << "\n    " << info.sources[i];
  if (info.sources.size() > 5) out << "\n    ... " << info.sources.size() - 5 << " more";
  out << "\n";
  return out.str();
}

}  // namespace roformer::data

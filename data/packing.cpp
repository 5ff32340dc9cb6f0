#include "data/packing.h"

#include <algorithm>
#include <optional>

#include "core/error.h"

namespace roformer::data {

ShardSet open_shards(const std::vector<std::string>& paths, const TokenizerIdentity* expected) {
  RF_INPUT_CHECK(!paths.empty(), "no corpus shards given");
  ShardSet shards;
  std::optional<TokenizerIdentity> first;
  for (const auto& path : paths) {
    const TokenizerIdentity* want = expected ? expected : (first ? &*first : nullptr);
    auto shard = std::make_shared<const Shard>(Shard::open(path, want));
    if (!first) first = shard->info().tokenizer;
    shards.push_back(std::move(shard));
  }
  return shards;
}

Packing::Packing(ShardSet shards, int64_t max_seq_len)
    : shards_(std::move(shards)), max_seq_len_(max_seq_len) {
  RF_INPUT_CHECK(max_seq_len_ >= 3, "max_seq_len must be at least 3 ([CLS] token [SEP]), not ",
                 max_seq_len_);
  const uint64_t per = uint64_t(max_seq_len_ - 2);
  first_sequence_.push_back(0);
  for (size_t s = 0; s < shards_.size(); ++s) {
    const Shard& shard = *shards_[s];
    num_tokens_ += shard.num_tokens();
    for (int64_t d = 0; d < shard.num_documents(); ++d) {
      const uint64_t n = shard.document(d).size();
      doc_shard_.push_back(uint32_t(s));
      doc_local_.push_back(uint64_t(d));
      first_sequence_.push_back(first_sequence_.back() + (n + per - 1) / per);
    }
  }
}

Packing::Location Packing::locate(int64_t i) const {
  RF_CHECK(i >= 0 && i < size(), "sequence ", i, " is outside the packing of ", size());
  // The last document whose first sequence is <= i.
  const auto it = std::upper_bound(first_sequence_.begin(), first_sequence_.end(), uint64_t(i));
  const int64_t doc = int64_t(it - first_sequence_.begin()) - 1;
  const uint64_t per = uint64_t(max_seq_len_ - 2);
  const uint64_t k = uint64_t(i) - first_sequence_[size_t(doc)];
  const uint64_t n =
      shards_[doc_shard_[size_t(doc)]]->document(int64_t(doc_local_[size_t(doc)])).size();
  return {doc, k * per, std::min(n, (k + 1) * per)};
}

std::span<const uint32_t> Packing::sequence(int64_t i) const {
  const Location loc = locate(i);
  const auto doc = shards_[doc_shard_[size_t(loc.document)]]->document(
      int64_t(doc_local_[size_t(loc.document)]));
  return doc.subspan(loc.begin, loc.end - loc.begin);
}

}  // namespace roformer::data

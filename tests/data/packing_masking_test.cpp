// Packing invariants and MLM masking statistics.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/masking.h"
#include "data/packing.h"
#include "test_util.h"

namespace roformer::data {
namespace {

using testing::bert_vocab;
using testing::TempDir;

// Two shards of documents with lengths 1..~900 (ids 1000..29999).
ShardSet make_shards(const TempDir& dir) {
  std::vector<std::string> paths;
  uint32_t x = 7;
  for (int s = 0; s < 2; ++s) {
    std::vector<uint32_t> tokens;
    std::vector<uint64_t> offsets{0};
    for (int d = 0; d < 40; ++d) {
      const int len = 1 + (d * 131 + s * 17) % 900;
      for (int i = 0; i < len; ++i) {
        x = x * 1664525u + 1013904223u;
        tokens.push_back(1000 + (x >> 8) % 29000);
      }
      offsets.push_back(tokens.size());
    }
    ShardInfo info;
    info.split = "train";
    info.tokenizer = Tokenizer(bert_vocab()).identity();
    paths.push_back(dir / ("train-" + std::to_string(s) + ".h5"));
    write_shard(paths.back(), info, tokens, offsets);
  }
  return open_shards(paths);
}

TEST(Packing, SequencesTileEveryDocumentExactlyOnce) {
  TempDir dir;
  const ShardSet shards = make_shards(dir);
  std::vector<uint32_t> corpus;
  for (auto& s : shards) corpus.insert(corpus.end(), s->tokens().begin(), s->tokens().end());
  for (int64_t len : {3, 4, 17, 128, 512, 1536}) {
    const Packing packing(shards, len);
    std::vector<uint32_t> joined;
    int64_t prev_doc = -1;
    uint64_t prev_end = 0, prev_len = 0;
    for (int64_t i = 0; i < packing.size(); ++i) {
      const auto seq = packing.sequence(i);
      ASSERT_GE(seq.size(), 1u);
      ASSERT_LE(int64_t(seq.size()), len - 2) << "max_seq_len " << len;
      const auto loc = packing.locate(i);
      // Consecutive text of one document: a new document starts at 0, else
      // the sequence continues where the previous one ended.
      if (loc.document != prev_doc) {
        EXPECT_EQ(loc.begin, 0u);
        EXPECT_EQ(loc.document, prev_doc + 1);
      } else {
        EXPECT_EQ(loc.begin, prev_end);
        EXPECT_EQ(prev_len, uint64_t(len - 2)) << "only a document's last chunk is short";
      }
      prev_len = loc.end - loc.begin;
      prev_doc = loc.document;
      prev_end = loc.end;
      joined.insert(joined.end(), seq.begin(), seq.end());
    }
    EXPECT_EQ(joined, corpus) << "max_seq_len " << len;
    EXPECT_EQ(packing.num_tokens(), int64_t(corpus.size()));
  }
  EXPECT_THROW(Packing(shards, 2), InputError);
}

// Sequences like the loader builds: [CLS] random ordinary ids [SEP].
std::vector<int32_t> random_sequence(PhiloxStream& rng, int len) {
  std::vector<int32_t> ids{101};
  for (int i = 0; i < len; ++i) ids.push_back(int32_t(1000 + rng.next_below(29000)));
  ids.push_back(102);
  return ids;
}

TEST(Masking, StatisticsOnAMillionTokens) {
  const MaskingVocab vocab = MaskingVocab::from(*bert_vocab());
  const MaskingOptions options;  // 0.15, 0.8, 0.1
  PhiloxStream data_rng(1, 2);
  int64_t candidates = 0, chosen = 0, as_mask = 0, as_random = 0, unchanged = 0;
  for (int64_t ex = 0; candidates < 1'100'000; ++ex) {
    // Lengths 1..510 so short sequences (where rounding matters) are included.
    std::vector<int32_t> ids = random_sequence(data_rng, 1 + int(ex * 7919 % 510));
    const std::vector<int32_t> original = ids;
    std::vector<int32_t> labels(ids.size());
    PhiloxStream rng(42, subsequence_of(0, uint64_t(ex)));
    chosen += mask_tokens(ids, labels, vocab, options, rng);
    candidates += int64_t(ids.size()) - 2;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i == 0 || i + 1 == ids.size()) {  // specials: never chosen
        ASSERT_EQ(labels[i], kIgnoreLabel);
        ASSERT_EQ(ids[i], original[i]);
        continue;
      }
      if (labels[i] == kIgnoreLabel) {
        ASSERT_EQ(ids[i], original[i]);
        continue;
      }
      ASSERT_EQ(labels[i], original[i]);
      if (ids[i] == vocab.mask_id)
        ++as_mask;
      else if (ids[i] != original[i]) {
        ++as_random;
        ASSERT_FALSE(vocab.special[size_t(ids[i])]) << "a random token must be ordinary";
      } else
        ++unchanged;
    }
  }
  ASSERT_EQ(as_mask + as_random + unchanged, chosen);
  const double rate = double(chosen) / double(candidates);
  EXPECT_NEAR(rate, 0.15, 0.005) << chosen << " of " << candidates;
  EXPECT_NEAR(double(as_mask) / double(chosen), 0.8, 0.01);
  EXPECT_NEAR(double(as_random) / double(chosen), 0.1, 0.01);
  EXPECT_NEAR(double(unchanged) / double(chosen), 0.1, 0.01);
}

TEST(Masking, WholeWordMaskingKeepsWordsWhole) {
  const auto vocab_ptr = bert_vocab();
  const Tokenizer tok(vocab_ptr);
  const MaskingVocab vocab = MaskingVocab::from(*vocab_ptr);
  MaskingOptions options;
  options.whole_word_masking = true;
  std::ifstream in(testing::kCorpus + "/moby-dick/chapter_42.txt");
  std::stringstream text;
  text << in.rdbuf();
  const auto all = tok.encode_ids(text.str());
  int64_t candidates = 0, chosen = 0, multi_piece_words_masked = 0;
  for (int epoch = 0; epoch < 20; ++epoch) {
    for (size_t start = 0; start < all.size(); start += 126) {
      std::vector<int32_t> ids{101};
      for (size_t i = start; i < std::min(all.size(), start + 126); ++i) ids.push_back(all[i]);
      ids.push_back(102);
      std::vector<int32_t> labels(ids.size());
      PhiloxStream rng(3, subsequence_of(uint64_t(epoch), start));
      chosen += mask_tokens(ids, labels, vocab, options, rng);
      candidates += int64_t(ids.size()) - 2;
      // Every word (a piece and the "##" pieces after it) is all in or all out.
      for (size_t i = 1; i + 1 < ids.size();) {
        size_t end = i + 1;
        while (end + 1 < ids.size() &&
               vocab_ptr->is_continuation(labels[end] != kIgnoreLabel ? labels[end] : ids[end]))
          ++end;
        const bool first = labels[i] != kIgnoreLabel;
        for (size_t k = i; k < end; ++k)
          ASSERT_EQ(labels[k] != kIgnoreLabel, first) << "word split at " << k;
        if (first && end - i > 1) ++multi_piece_words_masked;
        i = end;
      }
    }
  }
  EXPECT_GT(multi_piece_words_masked, 100);
  EXPECT_NEAR(double(chosen) / double(candidates), 0.15, 0.01);
}

TEST(Masking, DeterministicPerKey) {
  const MaskingVocab vocab = MaskingVocab::from(*bert_vocab());
  PhiloxStream data_rng(5, 5);
  const auto base = random_sequence(data_rng, 200);
  auto run = [&](uint64_t epoch) {
    auto ids = base;
    std::vector<int32_t> labels(ids.size());
    PhiloxStream rng(9, subsequence_of(epoch, 17));
    mask_tokens(ids, labels, vocab, MaskingOptions{}, rng);
    return std::make_pair(ids, labels);
  };
  EXPECT_EQ(run(0), run(0));
  EXPECT_NE(run(0), run(1)) << "masks are new each epoch";
  MaskingOptions bad;
  bad.mask_token_prob = 0.95;
  EXPECT_THROW(bad.validate(), InputError);
}

}  // namespace
}  // namespace roformer::data

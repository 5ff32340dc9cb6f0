// The loader: determinism, resume, rank shares, padding, stage changes.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/error.h"
#include "test_util.h"

namespace roformer::data {
namespace {

using testing::bert_vocab;
using testing::TempDir;

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    uint32_t x = 11;
    std::vector<std::string> paths;
    for (int s = 0; s < 2; ++s) {
      std::vector<uint32_t> tokens;
      std::vector<uint64_t> offsets{0};
      for (int d = 0; d < 30; ++d) {
        const int len = 1 + (d * 97 + s * 31) % 400;
        for (int i = 0; i < len; ++i) {
          x = x * 1664525u + 1013904223u;
          // Some "##" pieces so whole-word masking has words to keep together.
          tokens.push_back(i % 3 == 2 ? 2015 : 1000 + (x >> 8) % 28000);
        }
        offsets.push_back(tokens.size());
      }
      ShardInfo info;
      info.split = "train";
      info.tokenizer = Tokenizer(bert_vocab()).identity();
      paths.push_back(dir_ / ("train-" + std::to_string(s) + ".h5"));
      write_shard(paths.back(), info, tokens, offsets);
    }
    shards_ = open_shards(paths);
  }
  LoaderOptions options(int64_t len = 64, int64_t batch = 4) const {
    LoaderOptions o;
    o.max_seq_len = len;
    o.batch_size = batch;
    o.seed = 1234;
    return o;
  }
  TempDir dir_;
  ShardSet shards_;
};

bool same(const Batch& a, const Batch& b) {
  return a.batch_size == b.batch_size && a.seq_len == b.seq_len && a.input_ids == b.input_ids &&
         a.token_type_ids == b.token_type_ids && a.attention_mask == b.attention_mask &&
         a.labels == b.labels && a.num_masked == b.num_masked && a.sequence_ids == b.sequence_ids &&
         a.epochs == b.epochs;
}

TEST_F(LoaderTest, BatchesArePaddedWithAttentionMask) {
  Loader loader(shards_, bert_vocab(), options(64, 8));
  for (int step = 0; step < 30; ++step) {
    const Batch b = loader.next();
    ASSERT_EQ(b.batch_size, 8);
    ASSERT_LE(b.seq_len, 64);
    ASSERT_EQ(b.input_ids.size(), size_t(b.batch_size * b.seq_len));
    int64_t longest = 0, masked = 0, tokens = 0;
    for (int64_t r = 0; r < b.batch_size; ++r) {
      int64_t len = 0;
      for (int64_t c = 0; c < b.seq_len; ++c) {
        const size_t i = size_t(r * b.seq_len + c);
        if (b.attention_mask[i]) {
          ASSERT_EQ(len, c) << "attention mask must be a prefix";
          ++len;
        } else {
          ASSERT_EQ(b.input_ids[i], 0) << "padding is [PAD]";
          ASSERT_EQ(b.labels[i], kIgnoreLabel);
        }
        masked += b.labels[i] != kIgnoreLabel;
        ASSERT_EQ(b.token_type_ids[i], 0);
      }
      ASSERT_EQ(b.input_ids[size_t(r * b.seq_len)], 101) << "rows start with [CLS]";
      ASSERT_EQ(b.input_ids[size_t(r * b.seq_len + len - 1)], 102) << "rows end with [SEP]";
      longest = std::max(longest, len);
      tokens += len;
    }
    EXPECT_EQ(bucketed_length(longest, 64), b.seq_len)
        << "padded to the longest row, rounded up to a length bucket";
    EXPECT_EQ(masked, b.num_masked);
    EXPECT_EQ(tokens, b.num_tokens);
  }
}

// Padded lengths come in multiples of the bucket, capped by max_seq_len (and
// never below the longest row), so a stream of batches mints few shapes.
TEST(BucketedLength, RoundsUpToTheBucketWithinTheLimit) {
  EXPECT_EQ(bucketed_length(1, 128), 32);
  EXPECT_EQ(bucketed_length(32, 128), 32);
  EXPECT_EQ(bucketed_length(33, 128), 64);
  EXPECT_EQ(bucketed_length(100, 110), 110);  // capped by max_seq_len
  EXPECT_EQ(bucketed_length(120, 110), 120);  // a longer row is never cut
  EXPECT_EQ(bucketed_length(50, 512, 64), 64);
  EXPECT_EQ(bucketed_length(7, 512, 1), 7);
}

TEST_F(LoaderTest, DeterministicAndIndependentOfPrefetch) {
  auto o = options();
  Loader a(shards_, bert_vocab(), o);
  o.prefetch_batches = 0;
  Loader b(shards_, bert_vocab(), o);
  o.prefetch_batches = 5;
  Loader c(shards_, bert_vocab(), o);
  for (int i = 0; i < 40; ++i) {
    const Batch x = a.next(), y = b.next(), z = c.next();
    ASSERT_TRUE(same(x, y)) << i;
    ASSERT_TRUE(same(x, z)) << i;
  }
  auto other = options();
  other.seed = 99;
  Loader d(shards_, bert_vocab(), other);
  Loader e(shards_, bert_vocab(), options());
  EXPECT_FALSE(same(d.next(), e.next()));
}

TEST_F(LoaderTest, ResumeGivesTheSameBatches) {
  Loader uninterrupted(shards_, bert_vocab(), options());
  std::vector<Batch> want;
  LoaderState saved;
  // Long enough to cross an epoch boundary.
  const int steps = int(uninterrupted.batches_per_epoch()) + 10;
  for (int i = 0; i < steps; ++i) {
    if (i == steps / 2 + 3) saved = uninterrupted.state();
    want.push_back(uninterrupted.next());
  }
  EXPECT_GE(uninterrupted.state().epoch, 1u);
  // A new loader started from the saved state (as after a restart)...
  Loader resumed(shards_, bert_vocab(), options(), saved);
  for (int i = steps / 2 + 3; i < steps; ++i)
    ASSERT_TRUE(same(resumed.next(), want[size_t(i)])) << i;
  // ... and restore() on a running loader.
  resumed.restore(saved);
  for (int i = steps / 2 + 3; i < steps; ++i)
    ASSERT_TRUE(same(resumed.next(), want[size_t(i)])) << i;
}

TEST_F(LoaderTest, RankSharesAreDisjointAndCoverEachEpoch) {
  const int world = 3;
  const int64_t batch = 5;
  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < world; ++r) {
    auto o = options(32, batch);
    o.rank = r;
    o.world_size = world;
    ranks.push_back(std::make_unique<Loader>(shards_, bert_vocab(), o));
  }
  const int64_t n = ranks[0]->num_sequences();
  // Examples seen per epoch, and the masked ids each got.
  std::map<uint64_t, std::multiset<int64_t>> seen;
  std::map<std::pair<uint64_t, int64_t>, std::vector<int32_t>> rows;
  const int64_t steps = 2 * ranks[0]->batches_per_epoch() + 1;
  for (int64_t s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) {
      const Batch b = ranks[size_t(r)]->next();
      for (int64_t i = 0; i < b.batch_size; ++i) {
        seen[b.epochs[size_t(i)]].insert(b.sequence_ids[size_t(i)]);
        std::vector<int32_t> row(b.input_ids.begin() + i * b.seq_len,
                                 b.input_ids.begin() + (i + 1) * b.seq_len);
        while (!row.empty() && row.back() == 0) row.pop_back();
        rows[{b.epochs[size_t(i)], b.sequence_ids[size_t(i)]}] = row;
      }
    }
    // All ranks agree on the cursor.
    for (int r = 1; r < world; ++r) ASSERT_EQ(ranks[size_t(r)]->state(), ranks[0]->state());
  }
  for (uint64_t epoch : {0u, 1u}) {
    const auto& ids = seen[epoch];
    ASSERT_EQ(int64_t(ids.size()), n) << "epoch " << epoch << " read each example once";
    std::set<int64_t> unique(ids.begin(), ids.end());
    EXPECT_EQ(int64_t(unique.size()), n);
    EXPECT_EQ(*unique.begin(), 0);
    EXPECT_EQ(*unique.rbegin(), n - 1);
  }
  // One rank with the whole global batch reads the same stream with the same masks.
  Loader single(shards_, bert_vocab(), options(32, batch * world));
  for (int64_t s = 0; s < 4; ++s) {
    const Batch b = single.next();
    for (int64_t i = 0; i < b.batch_size; ++i) {
      std::vector<int32_t> row(b.input_ids.begin() + i * b.seq_len,
                               b.input_ids.begin() + (i + 1) * b.seq_len);
      while (!row.empty() && row.back() == 0) row.pop_back();
      ASSERT_EQ(row, (rows[{b.epochs[size_t(i)], b.sequence_ids[size_t(i)]}]));
    }
  }
}

TEST_F(LoaderTest, OneEpochPlacesEveryCorpusTokenOnce) {
  auto o = options(48, 7);
  o.mask = false;
  o.shuffle = true;
  Loader loader(shards_, bert_vocab(), o);
  std::map<uint32_t, int64_t> want, got;
  for (auto& s : shards_)
    for (uint32_t t : s->tokens()) ++want[t];
  const int64_t n = loader.num_sequences();
  int64_t read = 0;
  while (read < n) {
    const Batch b = loader.next();
    for (int64_t r = 0; r < b.batch_size && read < n; ++r, ++read) {
      ASSERT_EQ(b.epochs[size_t(r)], 0u);
      for (int64_t c = 1; c < b.seq_len; ++c) {
        const int32_t id = b.input_ids[size_t(r * b.seq_len + c)];
        if (id == 102 || id == 0) break;
        ++got[uint32_t(id)];
      }
    }
  }
  EXPECT_EQ(got, want);
}

TEST_F(LoaderTest, StagesAndChangedCorpus) {
  Loader stage1(shards_, bert_vocab(), options(64, 4));
  for (int i = 0; i < 5; ++i) stage1.next();
  const LoaderState s = stage1.state();
  EXPECT_EQ(s.max_seq_len, 64);
  EXPECT_EQ(s.index, 20u);
  // Another max_seq_len: the next epoch from its start.
  Loader stage2(shards_, bert_vocab(), options(128, 2), s);
  EXPECT_EQ(stage2.state().epoch, 1u);
  EXPECT_EQ(stage2.state().index, 0u);
  EXPECT_EQ(stage2.state().max_seq_len, 128);
  // The same max_seq_len with another batch size continues the same stream.
  Loader same_len(shards_, bert_vocab(), options(64, 2), s);
  EXPECT_EQ(same_len.state(), s);
  EXPECT_EQ(same_len.next().sequence_ids.front(), stage1.next().sequence_ids.front());
  LoaderState wrong = s;
  wrong.num_sequences += 1;
  EXPECT_THROW(Loader(shards_, bert_vocab(), options(64, 4), wrong), InputError);
  auto bad = options();
  bad.rank = 2;
  bad.world_size = 2;
  EXPECT_THROW(Loader(shards_, bert_vocab(), bad), InputError);
}

TEST_F(LoaderTest, ShardsOfAnotherVocabAreRefused) {
  std::vector<std::string> pieces = bert_vocab()->tokens();
  pieces.push_back("extra");
  auto other = std::make_shared<const Vocab>(Vocab::from_tokens(pieces, "other.txt"));
  try {
    Loader loader(shards_, other, options());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("other.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(bert_vocab()->hash()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace roformer::data

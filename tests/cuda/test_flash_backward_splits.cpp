// The fused attention backward's split count (core/cuda/kernels/
// flash_backward_splits.h): host arithmetic, no GPU needed. The first rule
// as it chose, the time model, and the counts the new rule gives on the
// shapes of the attention bench and of RoFormer-base's steps.
#include <gtest/gtest.h>

#include "core/cuda/kernels/flash_backward_splits.h"

namespace roformer::kernels::cuda {
namespace {

// sequences of `length` tokens, 12 heads of 64, on `sms` SMs.
BackwardSplitProblem problem(int64_t sequences, int64_t length, int64_t sms) {
  BackwardSplitProblem p;
  p.per_split = sequences * 12;
  p.key_tiles = (length + 127) / 128;
  p.query_rows = length;
  p.dq_elements = sequences * length * 12 * 64;
  p.sms = sms;
  return p;
}

TEST(FlashBackwardSplits, TheFirstRuleAsItChoseOnAnH200) {
  // The attention bench (32,768 tokens) on 132 SMs, session 20's counts.
  EXPECT_EQ(legacy_backward_splits(problem(64, 512, 132)), 1);
  EXPECT_EQ(legacy_backward_splits(problem(21, 1536, 132)), 2);
  EXPECT_EQ(legacy_backward_splits(problem(8, 4096, 132)), 3);
  EXPECT_EQ(legacy_backward_splits(problem(2, 16384, 132)), 8);
  EXPECT_EQ(legacy_backward_splits(problem(1, 200, 132)), 2);  // capped by the key tiles
}

TEST(FlashBackwardSplits, TheModelCountsWavesTheLongestBlockAndTheSlices) {
  const BackwardSplitProblem p = problem(8, 4096, 132);
  const double tile = 2.0 * 5 * 128 * 4096 * 64 / kBackwardFlopsPerSm;
  const double slice = double(p.dq_elements) * 4 / kBackwardBytesPerSecond;
  EXPECT_DOUBLE_EQ(backward_split_seconds(p, 1), 1 * 32 * tile);  // 96 blocks: one wave
  EXPECT_DOUBLE_EQ(backward_split_seconds(p, 3), 3 * 11 * tile + 4 * slice);
  EXPECT_DOUBLE_EQ(backward_split_seconds(p, 4), 3 * 8 * tile + 5 * slice);
}

TEST(FlashBackwardSplits, LongSequencesFillTheLastWave) {
  EXPECT_EQ(auto_backward_splits(problem(8, 4096, 132)), 4);
  // 11 splits (two full waves) would be fastest but take over 1 GiB of
  // slices; 5 make one wave of 26 key tiles where 8 made two of 16.
  EXPECT_EQ(auto_backward_splits(problem(2, 16384, 132)), 5);
  EXPECT_EQ(auto_backward_splits(problem(21, 1536, 132)), 1);  // no adding kernel, same waves
}

TEST(FlashBackwardSplits, TheFewestSplitsWithinTwoPercentAndTheirBytesBounded) {
  // 17 x 1024 on 132 SMs: 4 splits modelled fastest, 1 within 1% of it and
  // without slices (the first rule took 2, over 2% slower).
  EXPECT_EQ(legacy_backward_splits(problem(17, 1024, 132)), 2);
  EXPECT_EQ(auto_backward_splits(problem(17, 1024, 132)), 1);
  // 13 x 16384: 16 splits would take 10.5 GB of slices; at most 1 GiB (the
  // first rule took 2, 1.3 GB: it may keep that much).
  const BackwardSplitProblem p = problem(13, 16384, 132);
  const double slice = double(p.dq_elements) * 4;
  EXPECT_LE(double(auto_backward_splits(p)) * slice,
            std::max(double(1 << 30), double(legacy_backward_splits(p)) * slice));
}

TEST(FlashBackwardSplits, AnUnknownLengthKeepsTheFirstRule) {
  BackwardSplitProblem p = problem(8, 4096, 132);
  p.query_rows = 0;
  EXPECT_EQ(auto_backward_splits(p), legacy_backward_splits(p));
}

TEST(FlashBackwardSplits, TheModelsStepsKeepTheFirstRulesCount) {
  for (const auto& [sequences, length] :
       {std::pair{256, 512}, std::pair{128, 512}, std::pair{42, 1536}, std::pair{64, 1536},
        std::pair{64, 512}, std::pair{512, 128}}) {
    const BackwardSplitProblem p = problem(sequences, length, 132);
    EXPECT_EQ(auto_backward_splits(p), legacy_backward_splits(p)) << sequences << " x " << length;
  }
}

TEST(FlashBackwardSplits, AnotherCountOnlyWhenModelledMoreThanTwoPercentFaster) {
  for (const int64_t sms : {4, 78, 114, 132}) {
    for (const int64_t sequences : {1, 2, 3, 5, 8, 21, 64, 256}) {
      for (const int64_t length : {64, 200, 512, 1536, 4096, 16384}) {
        const BackwardSplitProblem p = problem(sequences, length, sms);
        const int64_t legacy = legacy_backward_splits(p), chosen = auto_backward_splits(p);
        ASSERT_GE(chosen, 1);
        ASSERT_LE(chosen, std::min<int64_t>(p.key_tiles, kMaxAutoBackwardSplits));
        if (chosen != legacy) {
          EXPECT_LT(backward_split_seconds(p, chosen), backward_split_seconds(p, legacy) / 1.02)
              << sms << " SMs, " << sequences << " x " << length;
          // Fewer splits are more than 2% slower than the chosen count.
          for (int64_t s = 1; s < chosen; ++s)
            EXPECT_GT(backward_split_seconds(p, s), backward_split_seconds(p, chosen))
                << sms << " SMs, " << sequences << " x " << length << ", " << s << " splits";
        }
      }
    }
  }
}

}  // namespace
}  // namespace roformer::kernels::cuda

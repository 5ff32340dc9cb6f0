// Per-stage overrides (issue 16): inheritance from the top level, stages in
// tokens, the batch-size warm-up's levels, the run's learning-rate schedule
// at chosen steps against hand-computed values, and the errors for bad values.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"
#include "train/config_stages.h"

namespace roformer {
namespace {

Config parse(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return parse_config_string(yaml, "stages.yaml", overrides);
}

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse(yaml, overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr const char* kTop = R"(
model: {rope_base: 10000}
data: {mask_prob: 0.15, shard_dir: shards/short}
optim: {lr: 1.0e-3, weight_decay: 0.01, schedule: linear, warmup_steps: 2, min_lr_ratio: 0.1}
)";

TEST(StageOverrides, UnsetKeysInheritTheTopLevel) {
  const Config c = parse(std::string(kTop) + R"(
stages:
  - {max_seq_len: 128, batch_size: 8, steps: 10}
  - {max_seq_len: 512, batch_size: 4, steps: 10, lr: 5.0e-4, weight_decay: 0.1, mask_prob: 0.3,
     rope_base: 160000, shard_dir: shards/long, micro_batch_size: 2}
)");
  const ResolvedStage a = resolve_stage(c, 0), b = resolve_stage(c, 1);
  EXPECT_EQ(a.lr, 1e-3);
  EXPECT_EQ(a.weight_decay, 0.01);
  EXPECT_EQ(a.mask_prob, 0.15);
  EXPECT_EQ(a.rope_base, 10000.0);
  EXPECT_EQ(a.shard_dir, "shards/short");
  EXPECT_EQ(a.micro_batch_size, 8);
  EXPECT_EQ(b.lr, 5e-4);
  EXPECT_EQ(b.weight_decay, 0.1);
  EXPECT_EQ(b.mask_prob, 0.3);
  EXPECT_EQ(b.rope_base, 160000.0);
  EXPECT_EQ(b.shard_dir, "shards/long");
  EXPECT_EQ(b.micro_batch_size, 2);
  // A top-level change reaches the stages that do not set the key.
  const Config d =
      parse(std::string(kTop) + "stages: [{max_seq_len: 128, batch_size: 8, steps: 10}]",
            {"data.mask_prob=0.2", "model.rope_base=500"});
  EXPECT_EQ(resolve_stage(d, 0).mask_prob, 0.2);
  EXPECT_EQ(resolve_stage(d, 0).rope_base, 500.0);
}

TEST(StageOverrides, TokensConvertWithTheStagesBatchAndLength) {
  // 2.5e9 / (256 x 512) = 19073.49 -> 19074 steps.
  const Config c = parse("stages: [{max_seq_len: 512, batch_size: 256, tokens: 2.5e9}]");
  EXPECT_EQ(c.stages[0].steps, 19074);
  EXPECT_EQ(resolve_stage(c, 0).tokens, 2.5e9);
  // A whole number of steps stays exact.
  EXPECT_EQ(parse("stages: [{max_seq_len: 64, batch_size: 4, tokens: 2560}]").stages[0].steps, 10);
  // The resolved YAML keeps both, consistently, and parses back equal.
  EXPECT_EQ(parse_config_string(to_yaml(c), "again.yaml"), c);
  // steps and tokens together must agree.
  EXPECT_EQ(error_of("stages: [{max_seq_len: 64, batch_size: 4, tokens: 2560, steps: 11}]"),
            "stages.yaml:1:64: stages[0].steps: give steps or tokens, not both: 2560 tokens make "
            "10 steps at this batch and length, steps says 11");
}

TEST(StageOverrides, BatchWarmupLevelsByHand) {
  // Batch 2 -> 8 in micro-batches of 2: levels 2, 4, 6, each a third of 512
  // tokens at length 32. Level 2: ceil(170.7 / 64) = 3 steps (192 tokens);
  // level 4: ceil((341.3 - 192) / 128) = 2 steps (448); level 6:
  // ceil((512 - 448) / 192) = 1 step (640 tokens). Then batch 8.
  const Config c = parse(R"(
stages:
  - {max_seq_len: 32, batch_size: 8, micro_batch_size: 2, steps: 10,
     batch_warmup_start: 2, batch_warmup_tokens: 512}
)");
  const ResolvedStage s = resolve_stage(c, 0);
  EXPECT_EQ(s.warm_up, (std::vector<BatchLevel>{{3, 2}, {5, 4}, {6, 6}}));
  const std::vector<int64_t> want = {2, 2, 2, 4, 4, 6, 8, 8, 8, 8};
  for (int64_t step = 0; step < 10; ++step) EXPECT_EQ(s.batch_at(step), want[size_t(step)]) << step;
  EXPECT_EQ(s.tokens_through(6), 640.0);
  EXPECT_EQ(s.tokens_through(10), 640.0 + 4 * 256);
  // In tokens: the warm-up's 640, then ceil((2000 - 640) / 256) = 6 full steps.
  const Config t = parse(R"(
stages:
  - {max_seq_len: 32, batch_size: 8, micro_batch_size: 2, tokens: 2000,
     batch_warmup_start: 2, batch_warmup_tokens: 512}
)");
  EXPECT_EQ(t.stages[0].steps, 12);
}

TEST(StageOverrides, BatchWarmupClimbsAtMostSixtyFourLevels) {
  const Config c = parse(R"(
stages:
  - {max_seq_len: 8, batch_size: 4096, micro_batch_size: 8, steps: 100000,
     batch_warmup_start: 8, batch_warmup_tokens: 1.0e7}
)");
  const ResolvedStage s = resolve_stage(c, 0);
  ASSERT_LE(s.warm_up.size(), size_t(kMaxBatchLevels));
  ASSERT_GE(s.warm_up.size(), 2u);
  for (size_t i = 0; i < s.warm_up.size(); ++i) {
    EXPECT_EQ(s.warm_up[i].batch % 8, 0);
    if (i > 0) {
      EXPECT_GT(s.warm_up[i].batch, s.warm_up[i - 1].batch);
    }
  }
  EXPECT_LT(s.warm_up.back().batch, 4096);
  EXPECT_GE(s.tokens_through(s.warm_up.back().end_step), 1e7);
}

TEST(StageSchedule, RunScheduleWithAStageOfItsOwnByHand) {
  // Run: linear warm-up 2, linear decay to 0.1 over stages 1 and 3 (20
  // steps in all); stage 2 runs its own wsd: warm-up 2, hold, 1-sqrt decay
  // over the last 4 of its 10 steps, floor 0.5, peak 5e-4.
  const Config c = parse(std::string(kTop) + R"(
stages:
  - {max_seq_len: 64, batch_size: 4, steps: 10}
  - {max_seq_len: 64, batch_size: 4, steps: 10, lr: 5.0e-4, schedule: wsd, warmup_steps: 2,
     decay_shape: 1-sqrt, decay_tokens: 1024, min_lr_ratio: 0.5}
  - {max_seq_len: 64, batch_size: 4, steps: 10, warmup_steps: 5}
)");
  const optim::LrSchedule s = make_lr_schedule(c);
  const double peak = 1e-3;
  // Run schedule over 30 steps: after warm-up, 28 steps from 1 to 0.1.
  auto run = [&](int64_t step) {
    return step < 2 ? double(step + 1) / 2 : 1 - 0.9 * double(step - 2) / 28;
  };
  EXPECT_DOUBLE_EQ(s.at(0), peak * 0.5);
  EXPECT_DOUBLE_EQ(s.at(5), peak * run(5));
  // Stage 2 (global 10..19): warm-up 1/2, 2/2, hold to in-stage step 5,
  // then 1 - 0.5 sqrt(k / 4) for k = 1..4.
  EXPECT_DOUBLE_EQ(s.at(10), 5e-4 * 0.5);
  EXPECT_DOUBLE_EQ(s.at(11), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(15), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(16), 5e-4 * (1 - 0.5 * std::sqrt(0.25)));
  EXPECT_DOUBLE_EQ(s.at(19), 5e-4 * 0.5);
  // Stage 3 (global 20..29): the run's schedule, re-warmed over 5 steps.
  EXPECT_DOUBLE_EQ(s.at(20), peak * run(20) * 1 / 5);
  EXPECT_DOUBLE_EQ(s.at(24), peak * run(24));
  EXPECT_DOUBLE_EQ(s.at(29), peak * run(29));
}

TEST(StageSchedule, RunWideWsdDecaysOverItsLastTokens) {
  // 10 + 10 steps of 256 tokens; the last 1280 tokens (5 steps) decay
  // linearly to 0.
  const Config c = parse(R"(
optim: {lr: 1.0, schedule: wsd, warmup_steps: 0, decay_tokens: 1280}
stages:
  - {max_seq_len: 64, batch_size: 4, steps: 10}
  - {max_seq_len: 64, batch_size: 4, steps: 10}
)");
  const optim::LrSchedule s = make_lr_schedule(c);
  EXPECT_DOUBLE_EQ(s.at(14), 1.0);
  EXPECT_DOUBLE_EQ(s.at(15), 1.0 - 1.0 / 5);
  EXPECT_DOUBLE_EQ(s.at(19), 0.0);
}

TEST(StageOverrides, ResolvedValuesAreDescribed) {
  const Config c = parse(std::string(kTop) + R"(
stages:
  - {max_seq_len: 32, batch_size: 8, micro_batch_size: 2, tokens: 2000,
     batch_warmup_start: 2, batch_warmup_tokens: 512, rope_base: 160000}
)");
  const std::string text = describe_stages_as_comments(c);
  EXPECT_NE(text.find("#   stage 1: max_seq_len 32, batch 8 (4 x 2), batch warm-up from 2 over 512 "
                      "tokens (6 steps), 12 steps (from 2000 tokens), lr 0.001"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("mask_prob 0.15, rope_base 160000, data shards/short"), std::string::npos)
      << text;
}

struct BadStage {
  const char* name;
  const char* stage;
  const char* message;
};

TEST(StageOverrides, BadValuesNameTheStageAndTheKey) {
  const BadStage cases[] = {
      {"negative token budget", "{max_seq_len: 64, batch_size: 4, tokens: -5}",
       "stages[1].tokens: expected a number in (0, 1e+18], got -5"},
      {"decay fraction above 1",
       "{max_seq_len: 64, batch_size: 4, steps: 10, schedule: wsd, decay_fraction: 1.5}",
       "stages[1].decay_fraction: expected a number in [0, 1], got 1.5"},
      {"warm-up longer than the stage",
       "{max_seq_len: 64, batch_size: 4, steps: 10, warmup_steps: 11}",
       "stages[1].warmup_steps: a warm-up of 11 steps is longer than the stage (10 steps)"},
      {"batch warm-up longer than the stage",
       "{max_seq_len: 64, batch_size: 4, micro_batch_size: 1, steps: 3, batch_warmup_start: 1, "
       "batch_warmup_tokens: 1000}",
       "stages[1].batch_warmup_tokens: the batch-size warm-up takes 11 steps, longer than the "
       "stage "
       "(3 steps)"},
      {"batch warm-up longer than a token budget",
       "{max_seq_len: 64, batch_size: 4, micro_batch_size: 1, tokens: 500, batch_warmup_start: 1, "
       "batch_warmup_tokens: 1000}",
       "stages[1].batch_warmup_tokens: the batch-size warm-up (1152 tokens, 11 steps) is not "
       "shorter than the stage (500 tokens)"},
      {"decay longer than the stage",
       "{max_seq_len: 64, batch_size: 4, steps: 10, schedule: wsd, warmup_steps: 2, "
       "decay_tokens: 2560}",
       "stages[1].decay_tokens: 2560 tokens are 10 steps of decay, more than the 8 steps the stage "
       "has after its warm-up"},
      {"decay key without a stage schedule",
       "{max_seq_len: 64, batch_size: 4, steps: 10, decay_fraction: 0.5}",
       "stages[1].decay_fraction: only used by a stage's own schedule"},
      {"warm-up start not below the batch",
       "{max_seq_len: 64, batch_size: 4, steps: 10, batch_warmup_start: 4, batch_warmup_tokens: "
       "10}",
       "stages[1].batch_warmup_start: 4 is not below the stage's batch_size 4"},
      {"warm-up start not whole micro-batches",
       "{max_seq_len: 64, batch_size: 8, micro_batch_size: 4, steps: 10, batch_warmup_start: 2, "
       "batch_warmup_tokens: 10}",
       "stages[1].batch_warmup_start: 2 is not a multiple of micro_batch_size 4"},
      {"half a warm-up", "{max_seq_len: 64, batch_size: 8, steps: 10, batch_warmup_tokens: 10}",
       "stages[1].batch_warmup_tokens: a batch-size warm-up needs both"},
      {"too many steps from tokens", "{max_seq_len: 8, batch_size: 1, tokens: 1.0e18}",
       "stages[1].tokens: 1e+18 tokens at 8 per step are 1.25e+17 steps, more than 1000000000000"},
      {"unbounded integer",
       "{max_seq_len: 64, batch_size: 8, steps: 10, batch_warmup_start: 1.0e13}",
       "stages[1].batch_warmup_start: expected a positive integer"},
      {"unknown decay shape",
       "{max_seq_len: 64, batch_size: 8, steps: 10, schedule: wsd, decay_shape: sqrt}",
       "stages[1].decay_shape: expected one of [linear, cosine, 1-sqrt], got \"sqrt\""},
  };
  for (const BadStage& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string yaml =
        std::string("stages:\n  - {max_seq_len: 64, batch_size: 4, steps: 10}\n  - ") + c.stage +
        "\n";
    const std::string error = error_of(yaml);
    EXPECT_NE(error.find(c.message), std::string::npos) << error;
    EXPECT_EQ(error.rfind("stages.yaml:3:", 0), 0u) << error;  // the stage's line
  }
  // The run-wide decay in tokens must fit the run.
  EXPECT_NE(error_of("optim: {schedule: wsd, decay_tokens: 1.0e6}\n"
                     "stages: [{max_seq_len: 64, batch_size: 4, steps: 10}]")
                .find("optim.decay_tokens: 1000000 tokens of decay are more than the run holds"),
            std::string::npos);
  EXPECT_NE(error_of("optim: {schedule: cosine, decay_tokens: 100}\n"
                     "stages: [{max_seq_len: 64, batch_size: 4, steps: 10}]")
                .find("optim.decay_tokens: only used by schedule: wsd"),
            std::string::npos);
}

}  // namespace
}  // namespace roformer

// Every shipped config in configs/ loads, validates, round-trips, and the two
// reference configs have the shapes the README and the paper promise.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "train/config.h"
#include "train/config_stages.h"

namespace roformer {
namespace {

const std::filesystem::path kConfigs = std::filesystem::path(ROFORMER_SOURCE_DIR) / "configs";

std::vector<std::filesystem::path> shipped_configs() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs))
    if (entry.path().extension() == ".yaml" || entry.path().extension() == ".yml")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(ShippedConfigs, EveryFileLoadsAndRoundTrips) {
  const auto files = shipped_configs();
  ASSERT_GE(files.size(), 2u);
  for (const auto& file : files) {
    SCOPED_TRACE(file.string());
    Config c;
    ASSERT_NO_THROW(c = load_config(file));
    EXPECT_EQ(parse_config_string(to_yaml(c), "emitted.yaml"), c);
    if (!c.stages.empty()) {
      EXPECT_NO_THROW(require_for(c, ConfigUse::kPretrain));
    }
    if (c.finetune) {
      EXPECT_NO_THROW(require_for(c, ConfigUse::kFinetune));
    }
  }
}

TEST(ShippedConfigs, PaperScheduleIsExact) {
  const Config c = load_config(kConfigs / "roformer_base_paper.yaml");
  std::vector<std::tuple<int64_t, int64_t, int64_t>> schedule;
  for (const auto& s : c.stages) schedule.emplace_back(s.max_seq_len, s.batch_size, s.steps);
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> paper = {
      {512, 256, 200000}, {1536, 256, 12500}, {256, 256, 120000},
      {128, 512, 80000},  {1536, 256, 10000}, {512, 512, 30000}};
  EXPECT_EQ(schedule, paper);
  EXPECT_EQ(c.model.num_hidden_layers, 12);
  EXPECT_EQ(c.model.hidden_size, 768);
  EXPECT_EQ(c.model.num_attention_heads, 12);
  EXPECT_EQ(c.model.intermediate_size, 3072);
  EXPECT_EQ(c.model.vocab_size, 50000);
  EXPECT_EQ(c.model.position, PositionEncoding::kRope);
  EXPECT_GE(c.model.max_position_embeddings, 1536);
}

TEST(ShippedConfigs, TinyIsTheCpuDefaultWithThePaperShape) {
  const Config c = load_config(kConfigs / "tiny.yaml");
  EXPECT_EQ(c.run.device, Device::cpu());
  EXPECT_EQ(c.run.dir, "runs/tiny");
  EXPECT_EQ(c.data.shard_dir, ".data/shards/tiny");
  EXPECT_EQ(c.model.vocab_size, 30522);
  EXPECT_EQ(c.model.position, PositionEncoding::kRope);
  EXPECT_EQ(c.model.head_dim() % 2, 0);
  // Six stages: long, longer, short, shortest, longer, long.
  ASSERT_EQ(c.stages.size(), 6u);
  const auto len = [&](size_t i) { return c.stages[i].max_seq_len; };
  EXPECT_GT(len(1), len(0));
  EXPECT_LT(len(2), len(0));
  EXPECT_LT(len(3), len(2));
  EXPECT_GT(len(4), len(0));
  EXPECT_LT(len(5), len(4));
  EXPECT_GT(len(5), len(2));
}

TEST(ShippedConfigs, ModernBertLikeScheduleHasItsShape) {
  // 1024 -> 8192 with the RoPE base raised 10k -> 160k, a batch warm-up in
  // the first stage, one WSD schedule decaying (1 - sqrt) over the last 50B tokens.
  const Config c = load_config(kConfigs / "modernbert_like.yaml");
  ASSERT_EQ(c.stages.size(), 2u);
  const ResolvedStage short_stage = resolve_stage(c, 0), long_stage = resolve_stage(c, 1);
  EXPECT_EQ(short_stage.max_seq_len, 1024);
  EXPECT_EQ(long_stage.max_seq_len, 8192);
  EXPECT_EQ(short_stage.rope_base, 10000.0);
  EXPECT_EQ(long_stage.rope_base, 160000.0);
  EXPECT_EQ(short_stage.mask_prob, 0.3);
  ASSERT_FALSE(short_stage.warm_up.empty());
  EXPECT_EQ(short_stage.warm_up.front().batch, 768);
  EXPECT_EQ(short_stage.batch_at(short_stage.warm_up.back().end_step), 4608);
  EXPECT_EQ(c.optim.schedule, optim::DecayKind::wsd);
  EXPECT_EQ(c.optim.decay_shape, optim::DecayShape::one_minus_sqrt);
  const optim::LrSchedule lr = make_lr_schedule(c);
  const int64_t total = c.total_steps();
  EXPECT_DOUBLE_EQ(lr.at(1000), 8e-4);                    // stable, stage 1
  EXPECT_DOUBLE_EQ(lr.at(c.stages[0].steps + 10), 3e-4);  // stable, stage 2
  EXPECT_LT(lr.at(total - 1000), 3e-4);                   // decaying
  EXPECT_DOUBLE_EQ(lr.at(total - 1), 0.0);                // to zero
  // The decay spans the last 5e10 tokens: ceil(5e10 / (72 x 8192)) steps.
  EXPECT_DOUBLE_EQ(lr.at(total - 84772 - 1), 3e-4);
  EXPECT_LT(lr.at(total - 84772), 3e-4);
}

}  // namespace
}  // namespace roformer

// Units behind the robustness fixes (docs/robustness.md): the memory
// estimate against real models, refusing enormous configs fast and by key,
// the vocabulary/model check, metrics write errors, config bounds.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "layers/roformer.h"
#include "optim/adamw.h"
#include "tests/test_support.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/metrics.h"
#include "train/vocab_check.h"

namespace roformer {
namespace {

using testing::error_of;

int64_t actual_parameters(const ModelConfig& m) {
  int64_t n = 0;
  for (const NamedTensor& p : RoFormerForMaskedLM(m, 0).named_parameters()) n += p.tensor.numel();
  return n;
}

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 97;
  m.hidden_size = 16;
  m.num_hidden_layers = 3;
  m.num_attention_heads = 2;
  m.intermediate_size = 40;
  m.max_position_embeddings = 32;
  return m;
}

TEST(MemoryEstimate, ParameterCountMatchesTheModel) {
  ModelConfig m = small_model();
  EXPECT_EQ(estimate_parameter_count(m), double(actual_parameters(m)));
  m.position = PositionEncoding::kAbsolute;
  EXPECT_EQ(estimate_parameter_count(m), double(actual_parameters(m)));
  m.embedding_size = 8;  // ALBERT-style factorised embedding
  EXPECT_EQ(estimate_parameter_count(m), double(actual_parameters(m)));
}

// BERT-base's width (the vocabulary stays small) with `layers` layers.
ModelConfig base_width_model(int64_t layers) {
  ModelConfig m = small_model();
  m.hidden_size = 768;
  m.num_attention_heads = 12;
  m.intermediate_size = 3072;
  m.num_hidden_layers = layers;
  return m;
}

Config tiny_config() {
  Config c;
  c.model = small_model();
  StageConfig s;
  s.max_seq_len = 32;
  s.batch_size = 4;
  s.micro_batch_size = 4;
  s.steps = 1;
  c.stages.push_back(s);
  return c;
}

// Refused in well under a second, naming the key and both sizes.
std::string refusal(const Config& c) {
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = error_of<InputError>([&] { check_memory_for_pretraining(c); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  EXPECT_NE(msg.find("is available"), std::string::npos) << msg;
  return msg;
}

TEST(MemoryEstimate, SmallConfigFits) {
  EXPECT_EQ(error_of([&] { check_memory_for_pretraining(tiny_config()); }), "no error");
}

TEST(MemoryEstimate, EnormousModelsAndBatchesAreRefusedByKey) {
  Config layers = tiny_config();
  layers.model = base_width_model(100000);
  EXPECT_EQ(refusal(layers).rfind("model.num_hidden_layers=100000: ", 0), 0u) << refusal(layers);

  Config hidden = tiny_config();
  hidden.model.hidden_size = 100000;
  hidden.model.num_attention_heads = 1;
  EXPECT_EQ(refusal(hidden).rfind("model.hidden_size=100000: ", 0), 0u) << refusal(hidden);

  Config batch = tiny_config();
  batch.stages[0].batch_size = batch.stages[0].micro_batch_size = int64_t(1) << 31;
  EXPECT_EQ(refusal(batch).rfind("stages.0.batch_size=2147483648: ", 0), 0u) << refusal(batch);
}

TEST(MemoryEstimate, EstimateGrowsWithEveryTerm) {
  const ModelConfig m = small_model();
  const MemoryEstimate base = estimate_memory(m, MemoryUse::kTraining, 4, 4, 32);
  EXPECT_GT(estimate_memory(m, MemoryUse::kTraining, 8, 8, 32).activations, base.activations);
  EXPECT_GT(estimate_memory(m, MemoryUse::kTraining, 4, 4, 64).activations, base.activations);
  EXPECT_EQ(base.gradients, base.parameters);
  EXPECT_EQ(base.moments, 2 * base.parameters);
  EXPECT_EQ(estimate_memory(m, MemoryUse::kInference).gradients, 0.0);
  EXPECT_EQ(estimate_memory(m, MemoryUse::kInference).moments, 0.0);
  EXPECT_GT(available_memory_bytes(), 0.0);
}

TEST(MemoryEstimate, ZeroOneDividesTheMomentsOnly) {
  const ModelConfig m = base_width_model(12);
  const double params = estimate_parameter_count(m);
  const MemoryEstimate whole = estimate_memory(m, MemoryUse::kTraining, 8, 8, 128);
  // Plain data parallelism: every rank holds the whole training state, and
  // activations for its share of the batch (2 of 8 sequences at 4 ranks).
  const MemoryEstimate plain = estimate_memory(m, MemoryUse::kTraining, 8, 8, 128, {4, 0});
  EXPECT_EQ(plain.parameters + plain.gradients + plain.moments,
            whole.parameters + whole.gradients + whole.moments);
  EXPECT_EQ(plain.activations, estimate_memory(m, MemoryUse::kTraining, 2, 2, 128).activations);
  EXPECT_LT(plain.activations, whole.activations);
  for (int64_t n : {2, 4, 8}) {
    const MemoryEstimate zero = estimate_memory(m, MemoryUse::kTraining, 8, 8, 128, {n, 1});
    EXPECT_EQ(zero.parameters, whole.parameters);
    EXPECT_EQ(zero.gradients, whole.gradients) << "gradients stay whole with ZeRO-1";
    EXPECT_EQ(zero.activations,
              estimate_memory(m, MemoryUse::kTraining, 8, 8 / n, 128).activations);
    // The largest share: 1/n, up to one alignment unit of both moments.
    EXPECT_GE(zero.moments, whole.moments / double(n));
    EXPECT_LE(zero.moments,
              whole.moments / double(n) + 2 * 4.0 * double(optim::AdamW::kShardAlignment));
    // Rank 0's share by AdamW::shard_bounds (the estimate counts no padding).
    EXPECT_EQ(zero.moments,
              2 * 4.0 * double(optim::AdamW::shard_bounds(int64_t(params), int(n))[1]));
  }
  // One rank has nothing to shard.
  EXPECT_EQ(estimate_memory(m, MemoryUse::kTraining, 8, 8, 128, {1, 1}).moments, whole.moments);
}

TEST(MemoryEstimate, RefusalNamesTheRanksAndTheZeroShare) {
  Config c = tiny_config();
  c.model = base_width_model(100000);
  c.distributed.zero = 1;
  const std::string msg = error_of<InputError>([&] { check_memory_for_pretraining(c, 4); });
  EXPECT_NE(msg.find("of memory per rank of 4 (parameters"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(ZeRO-1: this rank's 1/4)"), std::string::npos) << msg;
  c.distributed.zero = 0;
  const std::string plain = error_of<InputError>([&] { check_memory_for_pretraining(c, 4); });
  EXPECT_EQ(plain.find("ZeRO-1"), std::string::npos) << plain;
  EXPECT_EQ(refusal(c).find("per rank"), std::string::npos) << refusal(c);
}

TEST(VocabCheck, PaddingAllowedExcessRefusedWhenStrict) {
  // MosaicBERT: 30,522 tokens in a 30,528-row embedding.
  EXPECT_EQ(
      error_of([] { check_vocab_fits_model(30522, 30528, "v.txt", "k", VocabExcess::kRefuse); }),
      "no error");
  EXPECT_EQ(
      error_of([] { check_vocab_fits_model(30522, 40000, "v.txt", "k", VocabExcess::kWarn); }),
      "no error");
  EXPECT_NE(error_of([] {
              check_vocab_fits_model(5, 30522, "v.txt", "k", VocabExcess::kRefuse);
            }).find("too short"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              check_vocab_fits_model(0, 30522, "v.txt", "k", VocabExcess::kWarn);
            }).find("empty"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              check_vocab_fits_model(100, 50, "v.txt", "k", VocabExcess::kWarn);
            }).find("no embedding row"),
            std::string::npos);
}

TEST(Metrics, WriteErrorsAreReported) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  MetricsLog log("/dev/full", true, false);
  EXPECT_NE(error_of([&] {
              log.write({{"step", 1}});
            }).find("cannot write metrics file /dev/full"),
            std::string::npos);
}

// The trainer's mode: the error is kept for it to check after the step (it
// then saves a checkpoint and stops), and later records are skipped.
TEST(Metrics, DeferredWriteErrorIsKeptAndLaterWritesSkipped) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  MetricsLog log("/dev/full", true, false);
  log.set_defer_write_errors(true);
  EXPECT_NO_THROW(log.write({{"step", 1}}));
  EXPECT_NE(log.write_error().find("cannot write metrics file /dev/full: No space left on device"),
            std::string::npos)
      << log.write_error();
  EXPECT_NO_THROW(log.write({{"step", 2}}));
}

TEST(Metrics, FailedWriteLeavesNoPartialLine) {
  const auto path = std::filesystem::temp_directory_path() / "roformer_metrics_test.jsonl";
  std::filesystem::remove(path);
  {
    MetricsLog log(path, true, false);
    log.write({{"step", 1}});
    log.write({{"step", 2}});
  }
  std::ifstream in(path);
  std::string a, b, c;
  EXPECT_TRUE(std::getline(in, a) && std::getline(in, b));
  EXPECT_FALSE(std::getline(in, c));
  EXPECT_EQ(a, R"({"step":1})");
  std::filesystem::remove(path);
}

// The hook that runs before every record (the trainer saves its GEMM
// algorithm table there): it runs before the line is written, on ranks
// that write no file too; its failure fails the write, no line written.
TEST(Metrics, TheBeforeWriteHookRunsFirstAndItsFailureIsAWriteError) {
  const auto path = std::filesystem::temp_directory_path() / "roformer_metrics_hook_test.jsonl";
  std::filesystem::remove(path);
  {
    MetricsLog log(path, true, false);
    int calls = 0;
    log.set_before_write([&] {
      ++calls;
      std::ifstream in(path);
      std::string line;
      int lines = 0;
      while (std::getline(in, line)) ++lines;
      EXPECT_EQ(lines, calls - 1) << "the hook runs before its record is written";
      if (calls == 3) throw Error("cannot write GEMM algorithm table 'x.json': disk full");
    });
    log.write({{"step", 1}});
    log.write({{"step", 2}});
    log.set_defer_write_errors(true);
    EXPECT_NO_THROW(log.write({{"step", 3}}));
    EXPECT_EQ(log.write_error(), "cannot write GEMM algorithm table 'x.json': disk full");
    log.write({{"step", 4}});  // skipped, hook included
    EXPECT_EQ(calls, 3);
  }
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, 2);
  std::filesystem::remove(path);

  // Run on its own (the trainer, before a step's reduction): on a rank that
  // writes no file too, its failure kept as a write's, and nothing after it.
  MetricsLog other_rank("", false, false);
  int calls = 0;
  other_rank.set_before_write([&] {
    if (++calls == 3) throw Error("cannot write 'y'");
  });
  other_rank.write({{"step", 1}});
  other_rank.run_before_write();
  EXPECT_EQ(calls, 2);
  EXPECT_THROW(other_rank.run_before_write(), Error);  // not deferred: thrown
  EXPECT_TRUE(other_rank.write_error().empty());
  other_rank.set_defer_write_errors(true);
  calls = 2;
  other_rank.run_before_write();
  EXPECT_EQ(other_rank.write_error(), "cannot write 'y'");
  other_rank.run_before_write();
  other_rank.write({{"step", 2}});
  EXPECT_EQ(calls, 3);
}

TEST(ConfigBounds, HugeIntegersAreRefusedNotOverflowed) {
  const std::string base =
      "model: {hidden_size: 16, num_attention_heads: 2, intermediate_size: 32}\n"
      "stages: [{max_seq_len: 32, batch_size: 2, steps: 9223372036854775807}]\n";
  const std::string msg = error_of<InputError>([&] { parse_config_string(base, "c.yaml"); });
  EXPECT_NE(msg.find("stages[0].steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at most 1000000000000"), std::string::npos) << msg;
  // The largest accepted values still sum without overflow.
  std::string many =
      "model: {hidden_size: 16, num_attention_heads: 2, intermediate_size: 32}\nstages:\n";
  for (int i = 0; i < 8; ++i)
    many += "  - {max_seq_len: 32, batch_size: 2, steps: 1000000000000}\n";
  EXPECT_EQ(parse_config_string(many, "c.yaml").total_steps(), 8'000'000'000'000);
}

// Found by fuzz/fuzz_config: yaml-cpp would write the value back as U+FFFD,
// so the config saved with a run would name another file.
TEST(ConfigStrings, InvalidUtf8IsRefused) {
  const std::string raw = "data: {vocab: v\xf6.txt}\n";
  const std::string msg = error_of<InputError>([&] { parse_config_string(raw, "c.yaml"); });
  EXPECT_NE(msg.find("data.vocab: not valid UTF-8"), std::string::npos) << msg;
  const std::string list = "data: {inputs: [ok, \"b\xc3\"]}\n";
  EXPECT_NE(
      error_of<InputError>([&] { parse_config_string(list, "c.yaml"); }).find("not valid UTF-8"),
      std::string::npos);
}

}  // namespace
}  // namespace roformer

// Good-path config behaviour: defaults, overrides, the YAML round trip,
// per-command requirements.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"
#include "train/config_schema.h"

namespace roformer {
namespace {

constexpr const char* kMinimal = "stages:\n  - {max_seq_len: 128, batch_size: 32, steps: 10}\n";

Config parse(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return parse_config_string(yaml, "test.yaml", overrides);
}

// A config where every key differs from its default, so a round trip that
// dropped or mangled any key would show.
constexpr const char* kEverything = R"(
run: {name: full, dir: /tmp/full-run, seed: 99, device: cuda, precision: bf16, threads: 3}
model:
  vocab_size: 1000
  embedding_size: 32
  hidden_size: 64
  num_hidden_layers: 2
  num_attention_heads: 8
  intermediate_size: 128
  hidden_act: gelu
  hidden_dropout_prob: 0.25
  attention_probs_dropout_prob: 0.0
  max_position_embeddings: 256
  type_vocab_size: 1
  layer_norm_eps: 1.0e-5
  initializer_range: 0.125
  rotary_value: true
  pad_token_id: 3
  position: rope
  attention: linear
  rope_base: 500.5
  rope_layout: half
  attention_kernel: separate
data:
  vocab: v.txt
  lowercase: no
  inputs: ["a b/*.txt", "yes", "123", "#x"]
  input_format: jsonl
  jsonl_field: body
  shard_dir: shards/x
  validation_fraction: 0.2
  split_seed: 18446744073709551615
  mask_prob: 0.3
  mask_token_prob: 0.5
  random_token_prob: 0.25
  whole_word_masking: yes
  invalid_utf8: replace
  prefetch_batches: 0
optim:
  lr: 3.0e-4
  betas: [0.8, 0.98]
  eps: 1.0e-8
  weight_decay: 0.1
  decay_bias_and_norm: true
  clip_grad_norm: 0
  schedule: wsd
  warmup_steps: 2
  min_lr_ratio: 0.1
  decay_shape: 1-sqrt
  decay_fraction: 0.5
  decay_tokens: 100
  max_nonfinite_in_a_row: 0
stages:
  - {max_seq_len: 16, batch_size: 8, steps: 2, micro_batch_size: 4, lr: 0.001, warmup_steps: 1}
  - {max_seq_len: 32, batch_size: 6, steps: 3}
  - max_seq_len: 16
    batch_size: 8
    tokens: 300
    micro_batch_size: 2
    batch_warmup_start: 4
    batch_warmup_tokens: 100
    schedule: wsd
    warmup_steps: 1
    decay_shape: cosine
    decay_tokens: 32
    min_lr_ratio: 0.5
    weight_decay: 0.2
    mask_prob: 0.4
    rope_base: 160000
    shard_dir: shards/long
checkpoint: {every_steps: 0, keep_last: 0, keep_stage_ends: false}
log: {every_steps: 1, eval_every_steps: 0, eval_batches: 0, eval_every_length: true,
      progress: never, peak_tflops: 12.5}
finetune:
  task: triplet
  train_file: train.jsonl
  validation_file: dev.jsonl
  test_file: test.tsv
  format: tsv
  text_fields: [a, p, n]
  label_field: y
  labels: ["0", "1", "null"]
  max_seq_len: 64
  batch_size: 4
  epochs: 1
  lr: 2.0e-5
  warmup_ratio: 0.0
  init_checkpoint: runs/x/ckpt.h5
  early_stopping_patience: 2
  truncation: error
)";

TEST(Config, DefaultsFilledIn) {
  const Config c = parse(kMinimal);
  EXPECT_EQ(c.run, RunConfig{});
  EXPECT_EQ(c.run.dir, "runs/roformer");
  EXPECT_EQ(c.model, ModelConfig{});
  EXPECT_EQ(c.data, DataConfig{});
  EXPECT_EQ(c.optim, OptimConfig{});
  EXPECT_EQ(c.checkpoint, CheckpointConfig{});
  EXPECT_EQ(c.log, LogConfig{});
  EXPECT_FALSE(c.finetune.has_value());
  ASSERT_EQ(c.stages.size(), 1u);
  EXPECT_EQ(c.stages[0].max_seq_len, 128);
  EXPECT_EQ(c.stages[0].batch_size, 32);
  EXPECT_EQ(c.stages[0].steps, 10);
  EXPECT_EQ(c.stages[0].micro_batch_size, 32);  // defaults to the batch
  EXPECT_FALSE(c.stages[0].lr.has_value());
  EXPECT_FALSE(c.stages[0].warmup_steps.has_value());
  EXPECT_EQ(c.source, "test.yaml");
  EXPECT_EQ(c.model.embedding_dim(), 768);
  EXPECT_EQ(c.model.head_dim(), 64);
}

TEST(Config, RunDirFollowsNameUnlessSet) {
  EXPECT_EQ(parse(std::string("run: {name: exp1}\n") + kMinimal).run.dir, "runs/exp1");
  EXPECT_EQ(parse(std::string("run: {name: exp1, dir: elsewhere}\n") + kMinimal).run.dir,
            "elsewhere");
  EXPECT_EQ(parse(kMinimal, {"run.name=exp2"}).run.dir, "runs/exp2");
}

TEST(Config, ParsesEveryKey) {
  const Config c = parse(kEverything);
  EXPECT_EQ(c.run.device, Device::cuda(0));
  EXPECT_EQ(c.run.seed, 99u);
  EXPECT_EQ(c.model.embedding_size, 32);
  EXPECT_EQ(c.model.attention, AttentionKind::kLinear);
  EXPECT_EQ(c.model.rope_layout, RopeLayout::kHalf);
  EXPECT_EQ(c.model.attention_kernel, AttentionKernel::kSeparate);
  EXPECT_DOUBLE_EQ(c.model.rope_base, 500.5);
  EXPECT_FALSE(c.data.lowercase);  // "no" is false
  EXPECT_EQ(c.data.inputs, (std::vector<std::string>{"a b/*.txt", "yes", "123", "#x"}));
  EXPECT_EQ(c.data.split_seed, 18446744073709551615u);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.betas[1], 0.98);
  EXPECT_EQ(c.optim.schedule, optim::DecayKind::wsd);
  EXPECT_EQ(c.optim.decay_shape, optim::DecayShape::one_minus_sqrt);
  EXPECT_EQ(c.stages[0].lr, 0.001);
  EXPECT_EQ(c.stages[0].warmup_steps, 1);
  EXPECT_EQ(c.stages[1].micro_batch_size, 6);
  // 300 tokens: warm-up steps at 4 and 6 sequences of 16 (160 tokens), then
  // ceil(140 / 128) = 2 full steps.
  EXPECT_EQ(c.stages[2].steps, 4);
  EXPECT_EQ(c.stages[2].schedule, optim::DecayKind::wsd);
  EXPECT_EQ(c.stages[2].rope_base, 160000.0);
  EXPECT_EQ(c.total_steps(), 9);
  EXPECT_EQ(c.log.peak_tflops, 12.5);
  ASSERT_TRUE(c.finetune.has_value());
  EXPECT_EQ(c.finetune->task, FinetuneTask::kTriplet);
  EXPECT_EQ(c.finetune->labels, (std::vector<std::string>{"0", "1", "null"}));
  EXPECT_EQ(c.finetune->truncation, Truncation::kError);
}

TEST(Config, RunDeviceTakesAGpuIndexAndWritesItBack) {
  const Config c = parse(kMinimal, {"run.device=cuda:1"});
  EXPECT_EQ(c.run.device, Device::cuda(1));
  EXPECT_NE(to_yaml(c).find("device: cuda:1\n"), std::string::npos) << to_yaml(c);
  EXPECT_EQ(parse_config_string(to_yaml(c), "back.yaml").run.device, Device::cuda(1));
  // cuda:0 is written as configs usually say it.
  EXPECT_NE(to_yaml(parse(kMinimal, {"run.device=cuda:0"})).find("device: cuda\n"),
            std::string::npos);
  EXPECT_EQ(parse(kMinimal).run.device, Device::cpu());
}

TEST(Config, RunDeviceRefusesOtherText) {
  for (const char* bad : {"cuda:-1", "cuda:x", "gpu", "cuda:123456789012"}) {
    try {
      parse(kMinimal, {std::string("run.device=") + bad});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(
          std::string(e.what()).find("run.device: expected one of [cpu, cuda, cuda:N], got \"" +
                                     std::string(bad) + "\""),
          std::string::npos)
          << e.what();
    }
  }
}

TEST(Config, IntegersAreAcceptedForNumbersAndScalarsForLists) {
  const Config c = parse(std::string("optim: {lr: 1}\ndata: {inputs: corpus/*.txt}\n") + kMinimal);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.0);
  EXPECT_EQ(c.data.inputs, std::vector<std::string>{"corpus/*.txt"});
}

TEST(Config, OverridesApplyLikeFileValues) {
  const Config c =
      parse(std::string("model:\n  hidden_size: 64\n  num_attention_heads: 4\n") + kMinimal,
            {"optim.lr=3e-4", "stages.0.steps=10", "model.num_hidden_layers=2",
             "optim.betas=[0.9, 0.98]", "data.inputs=[a.txt, b/*.txt]", "model.embedding_size=16",
             "run.device=cuda", "log.progress=never", "stages.0.lr=5e-4"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.stages[0].steps, 10);
  EXPECT_EQ(c.model.num_hidden_layers, 2);
  EXPECT_EQ(c.model.hidden_size, 64);  // untouched keys keep their file values
  EXPECT_DOUBLE_EQ(c.optim.betas[1], 0.98);
  EXPECT_EQ(c.data.inputs, (std::vector<std::string>{"a.txt", "b/*.txt"}));
  EXPECT_EQ(c.model.embedding_size, 16);
  EXPECT_EQ(c.run.device, Device::cuda(0));
  EXPECT_EQ(c.log.progress, ProgressMode::kNever);
  EXPECT_EQ(c.stages[0].lr, 5e-4);
}

TEST(Config, LaterOverrideWinsAndNullUnsets) {
  const std::string yaml = std::string("model: {embedding_size: 128}\n") + kMinimal;
  EXPECT_EQ(parse(yaml).model.embedding_size, 128);
  EXPECT_FALSE(parse(yaml, {"model.embedding_size=null"}).model.embedding_size.has_value());
  EXPECT_FALSE(parse(yaml, {"model.embedding_size="}).model.embedding_size.has_value());
  EXPECT_DOUBLE_EQ(parse(kMinimal, {"optim.lr=1e-3", "optim.lr=2e-3"}).optim.lr, 2e-3);
}

TEST(Config, OverrideCanReplaceAWholeStage) {
  const Config c = parse(kMinimal, {"stages.0={max_seq_len: 64, batch_size: 4, steps: 3}"});
  EXPECT_EQ(c.stages[0].max_seq_len, 64);
  EXPECT_EQ(c.stages[0].micro_batch_size, 4);
}

TEST(Config, OverridesWorkOnAnEmptyFile) {
  const Config c = parse("", {"stages=[{max_seq_len: 32, batch_size: 2, steps: 1}]"});
  ASSERT_EQ(c.stages.size(), 1u);
  EXPECT_EQ(c.stages[0].max_seq_len, 32);
}

TEST(Config, FinetuneOnlyConfigNeedsNoStages) {
  const Config c = parse("finetune: {task: pair, train_file: t.jsonl}\n");
  EXPECT_TRUE(c.stages.empty());
  ASSERT_TRUE(c.finetune.has_value());
  EXPECT_EQ(c.finetune->text_fields, (std::vector<std::string>{"text_a", "text_b"}));
  EXPECT_EQ(parse("finetune: {task: triplet, train_file: t}\n").finetune->text_fields,
            (std::vector<std::string>{"anchor", "positive", "negative"}));
  EXPECT_EQ(parse("finetune: {task: classification, train_file: t}\n").finetune->text_fields,
            std::vector<std::string>{"text"});
}

TEST(Config, OddHeadDimIsFineWithoutRope) {
  const Config c =
      parse(std::string("model: {hidden_size: 36, num_attention_heads: 4, position: absolute}\n") +
            kMinimal);
  EXPECT_EQ(c.model.head_dim(), 9);
}

TEST(Config, RoundTripOfEveryKey) {
  const Config c = parse(kEverything);
  const std::string yaml = to_yaml(c);
  const Config back = parse_config_string(yaml, "emitted.yaml");
  EXPECT_EQ(back, c) << yaml;
  EXPECT_EQ(to_yaml(back), yaml);  // emitting is deterministic
}

TEST(Config, RoundTripOfDefaults) {
  const Config c = parse(kMinimal);
  const std::string yaml = to_yaml(c);
  EXPECT_EQ(parse_config_string(yaml, "emitted.yaml"), c) << yaml;
  // Every key is written out, including unset optionals as null.
  EXPECT_NE(yaml.find("embedding_size: ~"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("vocab: ~"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("micro_batch_size: 32"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("rope_base: 10000.0"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("layer_norm_eps: 1e-12"), std::string::npos) << yaml;
}

TEST(Config, RoundTripKeepsAwkwardDoubles) {
  const Config c = parse(kMinimal, {"optim.lr=0.1", "optim.eps=3.0000000000000004e-09",
                                    "model.initializer_range=0.30000000000000004"});
  const Config back = parse_config_string(to_yaml(c), "emitted.yaml");
  EXPECT_EQ(back.optim.lr, 0.1);
  EXPECT_EQ(back.optim.eps, 3.0000000000000004e-09);
  EXPECT_EQ(back.model.initializer_range, 0.30000000000000004);
}

TEST(Config, SaveAndLoad) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("roformer_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const Config c = parse(kEverything);
  save_config(c, dir / "config.yaml");
  // Nothing beside it: no temporary file (config.yaml.tmp.PID) is left.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"config.yaml"});
  const Config back = load_config(dir / "config.yaml");
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.source, (dir / "config.yaml").string());
  EXPECT_THROW(save_config(c, dir / "no-such-dir" / "config.yaml"), Error);
  std::filesystem::remove_all(dir);
}

TEST(Config, EqualityIgnoresSource) {
  Config a = parse(kMinimal);
  Config b = parse_config_string(kMinimal, "other.yaml");
  EXPECT_EQ(a, b);
  b.stages[0].steps = 11;
  EXPECT_NE(a, b);
}

TEST(Config, RequireForNamesTheMissingKey) {
  const Config c = parse(kMinimal);
  try {
    require_for(c, ConfigUse::kPretrain);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "test.yaml: data.vocab: required by 'pretrain' but not set (the path of a "
              "vocab.txt, e.g. data.vocab=PATH)");
  }
  const Config with_vocab = parse(kMinimal, {"data.vocab=v.txt"});
  EXPECT_NO_THROW(require_for(with_vocab, ConfigUse::kPretrain));
  try {
    require_for(with_vocab, ConfigUse::kPrepare);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "test.yaml: data.inputs: required by 'prepare' but not set (a list of text files "
              "or globs)");
  }
  EXPECT_THROW(require_for(with_vocab, ConfigUse::kFinetune), InputError);
  const Config finetune_only =
      parse("data: {vocab: v.txt}\nfinetune: {task: pair, train_file: t}\n");
  EXPECT_NO_THROW(require_for(finetune_only, ConfigUse::kFinetune));
  EXPECT_THROW(require_for(finetune_only, ConfigUse::kPretrain), InputError);  // no stages
}

TEST(ConfigSchema, DescribesRanges) {
  using namespace config_schema;
  EXPECT_EQ(describe(kPositive, true), "a positive integer");
  EXPECT_EQ(describe(kNonNegative, true), "a non-negative integer");
  EXPECT_EQ(describe(kAnyValue, false), "a number");
  EXPECT_EQ(describe(kProbability, false), "a number in [0, 1)");
  EXPECT_EQ(describe(kMaskProb, false), "a number in (0, 1]");
  EXPECT_EQ(describe(kMinSeqLen, true), "an integer >= 8");
}

TEST(ConfigSchema, EverySectionListsItsKeys) {
  using namespace config_schema;
  EXPECT_EQ(section_keys("optim").size(), 13u);
  EXPECT_EQ(
      section_keys("stages"),
      (std::vector<std::string_view>{
          "max_seq_len", "batch_size", "steps", "tokens", "micro_batch_size", "batch_warmup_start",
          "batch_warmup_tokens", "lr", "warmup_steps", "schedule", "decay_shape", "decay_fraction",
          "decay_tokens", "min_lr_ratio", "weight_decay", "mask_prob", "rope_base", "shard_dir"}));
  EXPECT_EQ(section_keys("model").size(), 20u);
  EXPECT_TRUE(section_keys("nonsense").empty());
}

}  // namespace
}  // namespace roformer

// The typed run configuration: YAML file + command-line overrides -> Config.
//
// Every problem is a roformer::InputError whose message starts with where the
// bad value came from and the key path, e.g.
//   configs/tiny.yaml:12:5: optim.warmup_steps: expected a non-negative integer, got "ten"
//   command-line override 'optim.lr=abc': optim.lr: expected a positive number, got "abc"
// docs/config.md is the reference for every key.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/gemm_table/gemm_table.h"
#include "data/text_reader.h"
#include "data/tokenizer.h"
#include "layers/model_config.h"
#include "optim/lr_schedule.h"

namespace roformer {

// Enums shared with the code that consumes them: data::InputFormat and data::InvalidUtf8
// (data/text_reader.h), optim::DecayKind (optim/lr_schedule.h). The config-only ones:
enum class Precision { kF32, kBf16 };
enum class ProgressMode { kAuto, kAlways, kNever };
enum class FinetuneTask { kClassification, kPair, kTriplet };
enum class TaskFormat { kJsonl, kTsv };
enum class Truncation { kError, kTruncate };

template <>
std::span<const EnumEntry<Precision>> enum_entries<Precision>();
template <>
std::span<const EnumEntry<data::InputFormat>> enum_entries<data::InputFormat>();
template <>
std::span<const EnumEntry<data::InvalidUtf8>> enum_entries<data::InvalidUtf8>();
template <>
std::span<const EnumEntry<optim::DecayKind>> enum_entries<optim::DecayKind>();
template <>
std::span<const EnumEntry<optim::DecayShape>> enum_entries<optim::DecayShape>();
template <>
std::span<const EnumEntry<ProgressMode>> enum_entries<ProgressMode>();
template <>
std::span<const EnumEntry<GemmAlgorithmChoice>> enum_entries<GemmAlgorithmChoice>();
template <>
std::span<const EnumEntry<FinetuneTask>> enum_entries<FinetuneTask>();
template <>
std::span<const EnumEntry<TaskFormat>> enum_entries<TaskFormat>();
template <>
std::span<const EnumEntry<Truncation>> enum_entries<Truncation>();

struct RunConfig {
  std::string name = "roformer";
  std::string dir = "runs/roformer";  // when absent from the file: "runs/<name>"
  uint64_t seed = 1234;
  Device device = Device::cpu();  // cpu, cuda (= cuda:0), cuda:N
  Precision precision = Precision::kF32;
  // How CUDA products choose their cuBLASLt algorithm (train/run_gemm_algorithms.h).
  GemmAlgorithmChoice gemm_algorithms = GemmAlgorithmChoice::kHeuristic;
  int64_t threads = 0;  // 0: all cores
  bool operator==(const RunConfig&) const = default;
};

struct DataConfig {
  std::string vocab;  // path to vocab.txt; "" = unset (required by prepare/pretrain)
  bool lowercase = true;
  data::PreTokenizer pre_tokenizer = data::PreTokenizer::none;  // jieba: RoFormer's Chinese words
  std::string jieba_dict;           // jieba's dict.txt; "" = python3-jieba's (data/jieba.h)
  std::vector<std::string> inputs;  // paths or globs of raw text
  data::InputFormat input_format = data::InputFormat::text;
  std::string jsonl_field = "text";
  std::string shard_dir = ".data/shards/default";
  double validation_fraction = 0.01;
  uint64_t split_seed = 17;
  double mask_prob = 0.15;         // fraction of tokens chosen for prediction
  double mask_token_prob = 0.8;    // of those: replaced by [MASK]
  double random_token_prob = 0.1;  // of those: replaced by a random token (rest kept)
  bool whole_word_masking = false;
  data::InvalidUtf8 invalid_utf8 = data::InvalidUtf8::error;
  int64_t prefetch_batches = 2;
  // Micro-batches as token streams (layers/token_layout.h): no padding is
  // computed (softmax attention on the CPU; otherwise rows are padded). On by
  // default: as fast as padded on nearly full rows (pretraining), faster on
  // short texts (docs/performance/cpu.md, "Unpadded batches").
  bool unpadded = true;
  bool packing = false;                   // short documents share a row (needs unpadded)
  bool packing_restart_positions = true;  // each packed document's positions start at 0
  bool operator==(const DataConfig&) const = default;
};

// Whether micro-batches run as token streams: data.unpadded, with softmax
// attention, on the CPU, or on CUDA under bf16 (where the tensor-core
// token-stream kernel runs; f32 token streams on CUDA would take the simple
// per-segment kernel, slower than padded rows).
inline bool uses_token_stream(const DataConfig& d, const ModelConfig& m, const RunConfig& run) {
  return d.unpadded && m.attention == AttentionKind::kSoftmax &&
         (run.device.is_cpu() || run.precision == Precision::kBf16);
}

// The tokenizer the data section describes (casing, pre-tokenizer).
inline data::TokenizerOptions tokenizer_options(const DataConfig& d) {
  data::TokenizerOptions o;
  o.lowercase = d.lowercase;
  o.pre_tokenizer = d.pre_tokenizer;
  o.jieba_dict = d.jieba_dict;
  return o;
}

struct OptimConfig {
  double lr = 1e-4;  // peak learning rate
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-6;
  double weight_decay = 0.01;
  bool decay_bias_and_norm = false;  // also decay biases and LayerNorm weights
  double clip_grad_norm = 1.0;       // 0: no clipping
  optim::DecayKind schedule = optim::DecayKind::linear;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;  // floor of the decay, as a fraction of the peak
  // wsd only: the shape of the decay, and its length as a fraction of the
  // steps after warm-up, or as the run's last decay_tokens tokens if set.
  optim::DecayShape decay_shape = optim::DecayShape::linear;
  double decay_fraction = 0.2;
  std::optional<double> decay_tokens;
  int64_t max_nonfinite_in_a_row = 5;
  bool operator==(const OptimConfig&) const = default;
};

// A stage of pretraining. Keys left unset inherit the top-level value
// (resolve_stage in train/config_stages.h gives the values a stage runs with).
struct StageConfig {
  int64_t max_seq_len = 0;
  int64_t batch_size = 0;  // global batch, in sequences
  // Duration: `steps`, or `tokens` (nominal: batch x max_seq_len per step),
  // from which the loader derives `steps`, so a loaded config always has it.
  int64_t steps = 0;
  std::optional<double> tokens;
  // Sequences per forward/backward; the loader fills in batch_size when the
  // file leaves it out, so a loaded config always has it set.
  int64_t micro_batch_size = 0;
  // Batch-size warm-up: the global batch starts at batch_warmup_start and
  // rises in multiples of micro_batch_size to batch_size over the stage's
  // first batch_warmup_tokens tokens.
  std::optional<int64_t> batch_warmup_start;
  std::optional<double> batch_warmup_tokens;
  std::optional<double> lr;             // this stage's peak lr (default: optim.lr)
  std::optional<int64_t> warmup_steps;  // re-warm-up at stage start (default: none)
  // The stage's own schedule over its own steps (warm-up: warmup_steps);
  // unset: the stage runs its share of the run's optim.schedule.
  std::optional<optim::DecayKind> schedule;
  std::optional<optim::DecayShape> decay_shape;  // default: optim.decay_shape
  std::optional<double> decay_fraction;          // default: optim.decay_fraction
  std::optional<double> decay_tokens;            // instead of decay_fraction
  std::optional<double> min_lr_ratio;            // default: optim.min_lr_ratio
  std::optional<double> weight_decay;            // default: optim.weight_decay
  std::optional<double> mask_prob;               // default: data.mask_prob
  std::optional<double> rope_base;               // default: model.rope_base
  std::optional<std::string> shard_dir;          // default: data.shard_dir
  bool operator==(const StageConfig&) const = default;
};

struct CheckpointConfig {
  int64_t every_steps = 1000;   // 0: only at stage ends and at the end
  int64_t keep_last = 3;        // 0: keep all
  bool keep_stage_ends = true;  // stage-end checkpoints survive keep_last pruning
  bool operator==(const CheckpointConfig&) const = default;
};

struct LogConfig {
  int64_t every_steps = 10;
  int64_t eval_every_steps = 500;  // 0: no periodic evaluation
  int64_t eval_batches = 20;
  // At each stage end, validate at every stage's length (with that stage's
  // masking, RoPE base and data), not only at the stage's own.
  bool eval_every_length = false;
  ProgressMode progress = ProgressMode::kAuto;
  // The device's peak in TFLOP/s for the MFU column; 0: a default for
  // run.device and run.precision (docs/pretraining.md, "Telemetry").
  double peak_tflops = 0.0;
  bool operator==(const LogConfig&) const = default;
};

// Data parallelism (docs/distributed.md); used only when a launcher starts
// more than one rank.
struct DistributedConfig {
  double bucket_mb = 25;   // gradient reduction bucket size, MiB
  double timeout_s = 120;  // a collective waiting longer throws (a peer died or hangs)
  int64_t zero = 0;        // 1: ZeRO-1, the AdamW moments sharded over the ranks
  // With ZeRO-1: reduce-scatter the gradients (each rank gets its share's
  // sum); false all-reduces them whole, as without ZeRO (for comparison).
  bool reduce_scatter = true;
  bool operator==(const DistributedConfig&) const = default;
};

struct FinetuneConfig {
  FinetuneTask task = FinetuneTask::kClassification;
  std::string train_file;
  std::string validation_file;  // "" = none
  std::string test_file;        // "" = none
  TaskFormat format = TaskFormat::kJsonl;
  // 1 field for classification, 2 for pair, 3 for triplet; the loader fills
  // in text / text_a,text_b / anchor,positive,negative when absent.
  std::vector<std::string> text_fields;
  std::string label_field = "label";
  std::vector<std::string> labels;  // empty: learned from train_file
  int64_t max_seq_len = 128;
  int64_t batch_size = 32;
  int64_t epochs = 3;
  double lr = 5e-5;
  double warmup_ratio = 0.1;
  std::string init_checkpoint;          // pretraining checkpoint or HF folder; "" = none
  int64_t early_stopping_patience = 0;  // 0: off
  Truncation truncation = Truncation::kTruncate;
  bool operator==(const FinetuneConfig&) const = default;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  std::vector<StageConfig> stages;  // required unless the config has a finetune section
  CheckpointConfig checkpoint;
  LogConfig log;
  DistributedConfig distributed;
  std::optional<FinetuneConfig> finetune;

  // Where the config came from ("configs/tiny.yaml"), for messages. Not part
  // of the YAML nor of equality.
  std::string source;

  int64_t total_steps() const;
  bool operator==(const Config& other) const;
};

// Reads `path`, applies `overrides` ("key.sub=value", list entries by index:
// "stages.0.steps=10"; values are YAML, so "optim.betas=[0.9, 0.98]" works),
// fills in defaults and validates. Throws InputError.
Config load_config(const std::filesystem::path& path,
                   const std::vector<std::string>& overrides = {});
// The same for YAML text; `source_name` stands for the file name in messages.
Config parse_config_string(std::string_view yaml, std::string source_name,
                           const std::vector<std::string>& overrides = {});

// The resolved config as YAML (every key, defaults filled in). Parsing it
// gives back an equal Config.
std::string to_yaml(const Config& config);
// Writes to_yaml(config) to `path` through a temporary file and a rename, so a
// reader never sees half a file. Throws Error on I/O failure.
void save_config(const Config& config, const std::filesystem::path& path);

// Keys a config may omit in general but a given command needs. Throws
// InputError naming the missing key and the config's source.
enum class ConfigUse { kPrepare, kPretrain, kFinetune };
void require_for(const Config& config, ConfigUse use);

}  // namespace roformer

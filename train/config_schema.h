// The config schema: one visit_* function per section lists its keys in
// order with their constraints. The YAML reader, the YAML writer and the
// unknown-key suggestions all walk these lists, so a key is declared once.
// Internal to train/config.cpp and its tests; not part of the public API.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "train/config.h"

namespace roformer::config_schema {

// Allowed interval of a numeric key; open ends excluded.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  bool lo_open = false;
  double hi = std::numeric_limits<double>::infinity();
  bool hi_open = false;

  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};
inline constexpr Range kAnyValue{};
inline constexpr Range kNonNegative{0.0, false};
inline constexpr Range kPositive{0.0, true};
inline constexpr Range kProbability{0.0, false, 1.0, true};  // [0, 1)
inline constexpr Range kFraction{0.0, false, 1.0, false};    // [0, 1]
inline constexpr Range kMaskProb{0.0, true, 1.0, false};     // (0, 1]
inline constexpr Range kMinSeqLen{8.0, false};
// Token budgets: positive and at most 10^18 (steps derived from them are
// bounded by kMaxInteger separately).
inline constexpr Range kTokenCount{0.0, true, 1e18, false};
// The largest magnitude any integer key accepts (10^12): sums and products of
// a few such values stay far from 2^63.
inline constexpr int64_t kMaxInteger = 1'000'000'000'000;

// "a positive integer", "a number in [0, 1)", "an integer >= 8".
std::string describe(const Range& range, bool integer);

// How a key is read and written besides its type.
struct Opt {
  Range range = kAnyValue;
  bool required = false;       // missing key is an error
  bool nullable = false;       // strings: null/absent means unset ("")
  bool omit_if_unset = false;  // optionals: leave out of the YAML when unset
};

// Model keys are type-checked here; their values are checked by
// find_model_config_issue (layers/model_config.cpp) so YAML and config.json
// share one set of rules.
template <class V, class M>
void visit_model(V& v, M& c) {
  v.field("vocab_size", c.vocab_size);
  v.field("embedding_size", c.embedding_size);
  v.field("hidden_size", c.hidden_size);
  v.field("num_hidden_layers", c.num_hidden_layers);
  v.field("num_attention_heads", c.num_attention_heads);
  v.field("intermediate_size", c.intermediate_size);
  v.field("hidden_act", c.hidden_act);
  v.field("hidden_dropout_prob", c.hidden_dropout_prob);
  v.field("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  v.field("max_position_embeddings", c.max_position_embeddings);
  v.field("type_vocab_size", c.type_vocab_size);
  v.field("layer_norm_eps", c.layer_norm_eps);
  v.field("initializer_range", c.initializer_range);
  v.field("rotary_value", c.rotary_value);
  v.field("pad_token_id", c.pad_token_id);
  v.field("position", c.position);
  v.field("attention", c.attention);
  v.field("rope_base", c.rope_base);
  v.field("rope_layout", c.rope_layout);
  v.field("attention_kernel", c.attention_kernel);
}

template <class V, class R>
void visit_run(V& v, R& c) {
  v.field("name", c.name);
  v.field("dir", c.dir);
  v.field("seed", c.seed);
  v.field("device", c.device);
  v.field("precision", c.precision);
  v.field("gemm_algorithms", c.gemm_algorithms);
  v.field("threads", c.threads, Opt{.range = kNonNegative});
}

template <class V, class D>
void visit_data(V& v, D& c) {
  v.field("vocab", c.vocab, Opt{.nullable = true});
  v.field("lowercase", c.lowercase);
  v.field("pre_tokenizer", c.pre_tokenizer);
  v.field("jieba_dict", c.jieba_dict, Opt{.nullable = true});
  v.field("inputs", c.inputs);
  v.field("input_format", c.input_format);
  v.field("jsonl_field", c.jsonl_field);
  v.field("shard_dir", c.shard_dir);
  v.field("validation_fraction", c.validation_fraction, Opt{.range = kProbability});
  v.field("split_seed", c.split_seed);
  v.field("mask_prob", c.mask_prob, Opt{.range = kMaskProb});
  v.field("mask_token_prob", c.mask_token_prob, Opt{.range = kFraction});
  v.field("random_token_prob", c.random_token_prob, Opt{.range = kFraction});
  v.field("whole_word_masking", c.whole_word_masking);
  v.field("invalid_utf8", c.invalid_utf8);
  v.field("prefetch_batches", c.prefetch_batches, Opt{.range = kNonNegative});
  v.field("unpadded", c.unpadded);
  v.field("packing", c.packing);
  v.field("packing_restart_positions", c.packing_restart_positions);
}

template <class V, class O>
void visit_optim(V& v, O& c) {
  v.field("lr", c.lr, Opt{.range = kPositive});
  v.field("betas", c.betas, Opt{.range = kProbability});
  v.field("eps", c.eps, Opt{.range = kPositive});
  v.field("weight_decay", c.weight_decay, Opt{.range = kNonNegative});
  v.field("decay_bias_and_norm", c.decay_bias_and_norm);
  v.field("clip_grad_norm", c.clip_grad_norm, Opt{.range = kNonNegative});
  v.field("schedule", c.schedule);
  v.field("warmup_steps", c.warmup_steps, Opt{.range = kNonNegative});
  v.field("min_lr_ratio", c.min_lr_ratio, Opt{.range = kFraction});
  v.field("decay_shape", c.decay_shape);
  v.field("decay_fraction", c.decay_fraction, Opt{.range = kFraction});
  v.field("decay_tokens", c.decay_tokens, Opt{.range = kTokenCount, .omit_if_unset = true});
  v.field("max_nonfinite_in_a_row", c.max_nonfinite_in_a_row, Opt{.range = kNonNegative});
}

template <class V, class S>
void visit_stage(V& v, S& c) {
  v.field("max_seq_len", c.max_seq_len, Opt{.range = kMinSeqLen, .required = true});
  v.field("batch_size", c.batch_size, Opt{.range = kPositive, .required = true});
  // steps or tokens: read_config checks that one is given.
  v.field("steps", c.steps, Opt{.range = kPositive});
  v.field("tokens", c.tokens, Opt{.range = kTokenCount, .omit_if_unset = true});
  v.field("micro_batch_size", c.micro_batch_size, Opt{.range = kPositive});
  v.field("batch_warmup_start", c.batch_warmup_start,
          Opt{.range = kPositive, .omit_if_unset = true});
  v.field("batch_warmup_tokens", c.batch_warmup_tokens,
          Opt{.range = kTokenCount, .omit_if_unset = true});
  v.field("lr", c.lr, Opt{.range = kPositive, .omit_if_unset = true});
  v.field("warmup_steps", c.warmup_steps, Opt{.range = kNonNegative, .omit_if_unset = true});
  v.field("schedule", c.schedule, Opt{.omit_if_unset = true});
  v.field("decay_shape", c.decay_shape, Opt{.omit_if_unset = true});
  v.field("decay_fraction", c.decay_fraction, Opt{.range = kFraction, .omit_if_unset = true});
  v.field("decay_tokens", c.decay_tokens, Opt{.range = kTokenCount, .omit_if_unset = true});
  v.field("min_lr_ratio", c.min_lr_ratio, Opt{.range = kFraction, .omit_if_unset = true});
  v.field("weight_decay", c.weight_decay, Opt{.range = kNonNegative, .omit_if_unset = true});
  v.field("mask_prob", c.mask_prob, Opt{.range = kMaskProb, .omit_if_unset = true});
  v.field("rope_base", c.rope_base, Opt{.range = kPositive, .omit_if_unset = true});
  v.field("shard_dir", c.shard_dir, Opt{.omit_if_unset = true});
}

template <class V, class K>
void visit_checkpoint(V& v, K& c) {
  v.field("every_steps", c.every_steps, Opt{.range = kNonNegative});
  v.field("keep_last", c.keep_last, Opt{.range = kNonNegative});
  v.field("keep_stage_ends", c.keep_stage_ends);
}

template <class V, class L>
void visit_log(V& v, L& c) {
  v.field("every_steps", c.every_steps, Opt{.range = kPositive});
  v.field("eval_every_steps", c.eval_every_steps, Opt{.range = kNonNegative});
  v.field("eval_batches", c.eval_batches, Opt{.range = kNonNegative});
  v.field("eval_every_length", c.eval_every_length);
  v.field("progress", c.progress);
  v.field("peak_tflops", c.peak_tflops, Opt{.range = kNonNegative});
}

template <class V, class D>
void visit_distributed(V& v, D& c) {
  v.field("bucket_mb", c.bucket_mb, Opt{.range = kPositive});
  v.field("timeout_s", c.timeout_s, Opt{.range = kPositive});
  v.field("zero", c.zero, Opt{.range = kFraction});  // a stage: 0 (off) or 1
  v.field("reduce_scatter", c.reduce_scatter);
}

template <class V, class F>
void visit_finetune(V& v, F& c) {
  v.field("task", c.task, Opt{.required = true});
  v.field("train_file", c.train_file, Opt{.required = true});
  v.field("validation_file", c.validation_file, Opt{.nullable = true});
  v.field("test_file", c.test_file, Opt{.nullable = true});
  v.field("format", c.format);
  v.field("text_fields", c.text_fields);
  v.field("label_field", c.label_field);
  v.field("labels", c.labels);
  v.field("max_seq_len", c.max_seq_len, Opt{.range = kMinSeqLen});
  v.field("batch_size", c.batch_size, Opt{.range = kPositive});
  v.field("epochs", c.epochs, Opt{.range = kPositive});
  v.field("lr", c.lr, Opt{.range = kPositive});
  v.field("warmup_ratio", c.warmup_ratio, Opt{.range = kFraction});
  v.field("init_checkpoint", c.init_checkpoint, Opt{.nullable = true});
  v.field("early_stopping_patience", c.early_stopping_patience, Opt{.range = kNonNegative});
  v.field("truncation", c.truncation);
}

// Names of the keys a visit_* function declares, in order.
struct KeyLister {
  std::vector<std::string_view> keys;
  template <class T>
  void field(std::string_view key, T&, Opt = {}) {
    keys.push_back(key);
  }
};

// Top-level sections in file order; "stages" is a list, "finetune" optional.
inline constexpr std::string_view kSections[] = {
    "run", "model", "data", "optim", "stages", "checkpoint", "log", "distributed", "finetune"};

// The keys of each mapping section ("stages" lists the keys of one entry).
std::vector<std::string_view> section_keys(std::string_view section);

}  // namespace roformer::config_schema

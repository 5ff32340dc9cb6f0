// Bad configs and bad overrides: each must fail with an InputError whose
// message is exactly what a user needs (file:line:col or the override, the
// key path, what was expected, a suggestion).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"

namespace roformer {
namespace {

constexpr const char* kStages = "stages:\n  - {max_seq_len: 128, batch_size: 32, steps: 10}\n";

struct BadConfig {
  const char* name;
  std::string yaml;
  std::vector<std::string> overrides;
  std::string message;  // the exact InputError message
};

std::ostream& operator<<(std::ostream& out, const BadConfig& c) {
  return out << c.name;
}

const std::vector<BadConfig>& bad_configs() {
  static const std::vector<BadConfig> cases = {
      {"unknown_top_level_key",
       std::string("modle:\n  hidden_size: 64\n") + kStages,
       {},
       "bad.yaml:1:1: modle: unknown key, did you mean 'model'?"},
      {"unknown_nested_key_with_suggestion",
       std::string("optim:\n  lr: 1e-3\n  warmup_step: 10\n") + kStages,
       {},
       "bad.yaml:3:3: optim.warmup_step: unknown key, did you mean 'warmup_steps'?"},
      {"key_in_wrong_section",
       std::string("run:\n  name: x\n  lr: 0.1\n") + kStages,
       {},
       "bad.yaml:3:3: run.lr: unknown key, did you mean 'optim.lr'?"},
      {"unknown_key_without_near_match_lists_keys",
       std::string("checkpoint:\n  frequency: 10\n") + kStages,
       {},
       "bad.yaml:2:3: checkpoint.frequency: unknown key (known keys in checkpoint: every_steps, "
       "keep_last, keep_stage_ends)"},
      {"unknown_key_in_stage_entry",
       "stages:\n  - {max_seq_len: 128, batchsize: 32, steps: 10}\n",
       {},
       "bad.yaml:2:24: stages[0].batchsize: unknown key, did you mean 'batch_size'?"},
      {"wrong_type_integer",
       std::string("optim:\n  warmup_steps: ten\n") + kStages,
       {},
       "bad.yaml:2:17: optim.warmup_steps: expected a non-negative integer, got \"ten\""},
      {"wrong_type_float_for_integer",
       std::string("model:\n  num_hidden_layers: 2.5\n") + kStages,
       {},
       "bad.yaml:2:22: model.num_hidden_layers: expected an integer, got \"2.5\""},
      {"wrong_type_bool",
       std::string("data:\n  lowercase: maybe\n") + kStages,
       {},
       "bad.yaml:2:14: data.lowercase: expected true or false, got \"maybe\""},
      {"wrong_type_list_for_scalar",
       std::string("optim:\n  lr: [1, 2]\n") + kStages,
       {},
       "bad.yaml:2:7: optim.lr: expected a positive number, got a list"},
      {"negative_steps",
       "stages:\n  - {max_seq_len: 128, batch_size: 32, steps: -5}\n",
       {},
       "bad.yaml:2:47: stages[0].steps: expected a positive integer, got -5"},
      {"empty_stages",
       "stages: []\n",
       {},
       "bad.yaml:1:9: stages: expected a non-empty list of stages, got an empty list"},
      {"stages_not_a_list",
       "stages:\n  max_seq_len: 128\n",
       {},
       "bad.yaml:2:3: stages: expected a non-empty list of stages, got a mapping"},
      {"missing_stages",
       "model:\n  hidden_size: 64\n  num_attention_heads: 4\n",
       {},
       "bad.yaml:1:1: stages: required key is missing (a pretraining config needs a list of "
       "{max_seq_len, batch_size, steps} stages)"},
      {"missing_required_stage_key",
       "stages:\n  - {max_seq_len: 128, batch_size: 32, steps: 10}\n"
       "  - max_seq_len: 64\n    batch_size: 64\n",
       {},
       "bad.yaml:3:5: stages[1].steps: required key is missing: a stage lasts `steps` optimizer "
       "steps or `tokens` tokens"},
      {"missing_required_finetune_key",
       "finetune:\n  train_file: train.jsonl\n",
       {},
       "bad.yaml:2:3: finetune.task: required key is missing"},
      {"stage_seq_len_too_short",
       "stages:\n  - {max_seq_len: 4, batch_size: 32, steps: 10}\n",
       {},
       "bad.yaml:2:19: stages[0].max_seq_len: expected an integer >= 8, got 4"},
      {"micro_batch_does_not_divide_batch",
       "stages:\n  - max_seq_len: 128\n    batch_size: 32\n    steps: 10\n"
       "    micro_batch_size: 12\n",
       {},
       "bad.yaml:5:23: stages[0].micro_batch_size: 12 does not divide batch_size 32"},
      {"odd_head_dim",
       std::string("model:\n  hidden_size: 36\n  num_attention_heads: 4\n") + kStages,
       {},
       "bad.yaml:3:24: model.num_attention_heads: head dimension 9 must be even for rotary "
       "position embedding (model.hidden_size 36 / model.num_attention_heads 4); change those "
       "sizes or set model.position to absolute or none"},
      {"hidden_not_divisible_by_heads",
       std::string("model:\n  hidden_size: 100\n  num_attention_heads: 3\n") + kStages,
       {},
       "bad.yaml:2:16: model.hidden_size: model.hidden_size (100) must be divisible by "
       "model.num_attention_heads (3)"},
      {"zero_model_size",
       std::string("model:\n  intermediate_size: 0\n") + kStages,
       {},
       "bad.yaml:2:22: model.intermediate_size: expected a positive integer, got 0"},
      {"bad_enum_value",
       std::string("model:\n  position: rotary\n") + kStages,
       {},
       "bad.yaml:2:13: model.position: expected one of [rope, absolute, none], got \"rotary\""},
      {"bad_enum_value_with_suggestion",
       std::string("run:\n  device: cdua\n") + kStages,
       {},
       "bad.yaml:2:11: run.device: expected one of [cpu, cuda, cuda:N], got \"cdua\" (did you mean "
       "'cuda'?)"},
      {"unsupported_activation",
       std::string("model:\n  hidden_act: relu\n") + kStages,
       {},
       "bad.yaml:2:15: model.hidden_act: expected \"gelu\" (the erf form) or \"gelu_new\" (the "
       "tanh approximation), got \"relu\""},
      {"probability_out_of_range",
       std::string("model:\n  hidden_dropout_prob: 1.0\n") + kStages,
       {},
       "bad.yaml:2:24: model.hidden_dropout_prob: expected a number in [0, 1), got 1"},
      {"mask_prob_zero",
       std::string("data:\n  mask_prob: 0\n") + kStages,
       {},
       "bad.yaml:2:14: data.mask_prob: expected a number in (0, 1], got 0"},
      {"mask_replacement_probabilities_exceed_one",
       std::string("data:\n  mask_token_prob: 0.9\n  random_token_prob: 0.2\n") + kStages,
       {},
       "bad.yaml:3:22: data.random_token_prob: data.mask_token_prob + data.random_token_prob "
       "must be at most 1, got 0.9 + 0.2"},
      {"packing_without_unpadded",
       std::string("data:\n  unpadded: false\n  packing: true\n") + kStages,
       {},
       "bad.yaml:3:12: data.packing: data.packing: needs data.unpadded: true (packed rows are "
       "token streams)"},
      {"packing_with_linear_attention",
       std::string("model:\n  attention: linear\ndata:\n  unpadded: true\n  packing: true\n") +
           kStages,
       {},
       "bad.yaml:5:12: data.packing: data.packing: needs model.attention: softmax"},
      {"cudnn_sdpa_with_attention_dropout",
       std::string("model:\n  attention_kernel: cudnn_sdpa\n") + kStages,
       {},
       "bad.yaml:2:21: model.attention_kernel: cudnn_sdpa has no attention dropout that follows "
       "the shared Philox rule: set model.attention_probs_dropout_prob: 0 (got 0.1) or choose "
       "another model.attention_kernel"},
      {"cudnn_sdpa_on_the_cpu",
       std::string("model:\n  attention_kernel: cudnn_sdpa\n  attention_probs_dropout_prob: 0\n") +
           kStages,
       {},
       "bad.yaml:2:21: model.attention_kernel: cudnn_sdpa runs on CUDA only (run.device)"},
      {"cudnn_sdpa_on_token_streams",
       std::string("model:\n  attention_kernel: cudnn_sdpa\n  attention_probs_dropout_prob: 0\n"
                   "run:\n  device: cuda\n  precision: bf16\n") +
           kStages,
       {},
       "bad.yaml:2:21: model.attention_kernel: cudnn_sdpa takes padded batches only: set "
       "data.unpadded: false (token streams run on the other kernels)"},
      {"gemm_algorithms_timed_on_the_cpu",
       std::string("run:\n  gemm_algorithms: timed\n") + kStages,
       {},
       "bad.yaml:2:20: run.gemm_algorithms: timed chooses among cuBLASLt's "
       "algorithms and needs run.device: cuda (the CPU's products have no such choice)"},
      {"gemm_algorithms_unknown",
       std::string("run:\n  device: cuda\n  gemm_algorithms: fastest\n") + kStages,
       {},
       "bad.yaml:3:20: run.gemm_algorithms: expected one of [heuristic, timed], got \"fastest\""},
      {"packing_not_a_bool",
       std::string("data:\n  packing: sometimes\n") + kStages,
       {},
       "bad.yaml:2:12: data.packing: expected true or false, got \"sometimes\""},
      {"betas_wrong_length",
       std::string("optim:\n  betas: [0.9]\n") + kStages,
       {},
       "bad.yaml:2:10: optim.betas: expected a list of two numbers in [0, 1), got a list"},
      {"beta_out_of_range",
       std::string("optim:\n  betas: [0.9, 1.5]\n") + kStages,
       {},
       "bad.yaml:2:16: optim.betas[1]: expected a number in [0, 1), got 1.5"},
      {"zero_stage_beyond_one",
       std::string("distributed:\n  zero: 2\n") + kStages,
       {},
       "bad.yaml:2:9: distributed.zero: expected an integer in [0, 1], got 2"},
      {"duplicate_key",
       std::string("optim:\n  lr: 1e-3\n  lr: 2e-3\n") + kStages,
       {},
       "bad.yaml:3:3: optim.lr: duplicate key (first set at line 2)"},
      {"section_not_a_mapping",
       std::string("optim: 5\n") + kStages,
       {},
       "bad.yaml:1:8: optim: expected a mapping of keys, got \"5\""},
      {"top_level_not_a_mapping",
       "- a\n- b\n",
       {},
       "bad.yaml:1:1: expected a mapping of sections (run, model, data, optim, stages, "
       "checkpoint, log, distributed, finetune), got a list"},
      {"absolute_position_seq_len_beyond_table",
       "model:\n  position: absolute\n  max_position_embeddings: 512\n"
       "stages:\n  - {max_seq_len: 1024, batch_size: 8, steps: 10}\n",
       {},
       "bad.yaml:5:19: stages[0].max_seq_len: 1024 exceeds model.max_position_embeddings (512), "
       "the length of the learned position table used by model.position: absolute"},
      {"finetune_text_fields_count",
       "finetune:\n  task: pair\n  train_file: t.jsonl\n  text_fields: [a]\n",
       {},
       "bad.yaml:4:16: finetune.text_fields: task pair needs 2 text fields, got 1"},
      {"finetune_duplicate_labels",
       "finetune:\n  task: classification\n  train_file: t.jsonl\n  labels: [spam, ham, spam]\n",
       {},
       "bad.yaml:4:11: finetune.labels: label \"spam\" is listed twice"},
      {"pad_token_beyond_vocab",
       std::string("model:\n  vocab_size: 100\n  pad_token_id: 100\n") + kStages,
       {},
       "bad.yaml:3:17: model.pad_token_id: expected an id in [0, model.vocab_size=100), got 100"},
      {"yaml_syntax_error",
       "model:\n  hidden_size: 64\n  num_attention_heads: [4\nstages: []\n",
       {},
       "bad.yaml:4:7: YAML syntax error: end of sequence flow not found"},
      {"override_without_equals",
       kStages,
       {"optim.lr"},
       "command-line override 'optim.lr': expected KEY=VALUE, e.g. optim.lr=3e-4"},
      {"override_empty_key",
       kStages,
       {"=3"},
       "command-line override '=3': expected KEY=VALUE, the key is empty"},
      {"override_empty_component",
       kStages,
       {"optim..lr=1"},
       "command-line override 'optim..lr=1': 'optim..lr' has an empty key between dots"},
      {"override_bad_characters",
       kStages,
       {"optim.l r=1"},
       "command-line override 'optim.l r=1': 'l r' is not a key name"},
      {"override_invalid_yaml_value",
       kStages,
       {"optim.betas=[0.9"},
       "command-line override 'optim.betas=[0.9': the value is not valid YAML: end of sequence "
       "flow not found"},
      {"override_unknown_key",
       kStages,
       {"optim.lrr=1"},
       "command-line override 'optim.lrr=1': optim.lrr: unknown key, did you mean 'lr'?"},
      {"override_unknown_section",
       kStages,
       {"optimm.lr=1"},
       "command-line override 'optimm.lr=1': optimm: unknown key, did you mean 'optim'?"},
      {"override_wrong_type",
       kStages,
       {"optim.lr=abc"},
       "command-line override 'optim.lr=abc': optim.lr: expected a positive number, got \"abc\""},
      {"override_stage_index_out_of_range",
       kStages,
       {"stages.3.steps=10"},
       "command-line override 'stages.3.steps=10': stages has 1 entry, so there is no index 3"},
      {"override_into_a_value",
       std::string("optim: {lr: 1e-3}\n") + kStages,
       {"optim.lr.x=1"},
       "command-line override 'optim.lr.x=1': optim.lr is a value, not a section"},
      {"override_adds_a_mapping_where_a_value_belongs",
       kStages,
       {"optim.lr.x=1"},
       "command-line override 'optim.lr.x=1': optim.lr: expected a positive number, got a "
       "mapping"},
      {"override_index_into_a_mapping",
       kStages,
       {"model.0=1"},
       "command-line override 'model.0=1': model has no entry 0: it is not in the config"},
      {"override_blamed_for_cross_key_error",
       std::string("model:\n  hidden_size: 64\n  num_attention_heads: 4\n") + kStages,
       {"model.hidden_size=36"},
       "command-line override 'model.hidden_size=36': model.hidden_size: head dimension 9 must "
       "be even for rotary position embedding (model.hidden_size 36 / model.num_attention_heads "
       "4); change those sizes or set model.position to absolute or none"},
      {"override_breaks_micro_batch",
       kStages,
       {"stages.0.micro_batch_size=5"},
       "command-line override 'stages.0.micro_batch_size=5': stages[0].micro_batch_size: 5 does "
       "not divide batch_size 32"},
  };
  return cases;
}

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, FailsWithPreciseMessage) {
  const BadConfig& c = GetParam();
  try {
    parse_config_string(c.yaml, "bad.yaml", c.overrides);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), c.message);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BadConfigTest, ::testing::ValuesIn(bad_configs()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConfigErrors, MissingFileNamesThePath) {
  try {
    load_config("/nonexistent/dir/missing.yaml");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot read config file '/nonexistent/dir/missing.yaml': No such file or "
              "directory");
  }
}

TEST(ConfigErrors, TableCoversAtLeastTwentyCases) {
  EXPECT_GE(bad_configs().size(), 20u);
}

}  // namespace
}  // namespace roformer

// ModelConfig validation and the Hugging Face config.json mapping.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "layers/model_config.h"

namespace roformer {
namespace {

using nlohmann::json;

std::string validation_error(const ModelConfig& c) {
  try {
    validate_model_config(c);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string hf_error(const json& j) {
  try {
    from_hf_config_json(j, "hf/config.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// In the shape of the config.json of the public Chinese RoFormer-base
// checkpoints (transformers' RoFormerConfig.to_json_string()).
const json kHfBase = json::parse(R"({
  "architectures": ["RoFormerForMaskedLM"],
  "attention_probs_dropout_prob": 0.1,
  "embedding_size": 768,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 1536,
  "model_type": "roformer",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 0,
  "rotary_value": false,
  "type_vocab_size": 2,
  "use_cache": true,
  "torch_dtype": "float32",
  "transformers_version": "4.30.0",
  "vocab_size": 50000
})");

TEST(ModelConfig, DefaultsAreValidAndMatchRoformerBase) {
  const ModelConfig c;
  EXPECT_EQ(validation_error(c), "");
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_EQ(c.embedding_dim(), 768);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_EQ(c.position, PositionEncoding::kRope);
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
}

TEST(ModelConfig, RejectsOddHeadDimForRope) {
  ModelConfig c;
  c.hidden_size = 36;
  c.num_attention_heads = 4;
  EXPECT_EQ(validation_error(c),
            "model.num_attention_heads: head dimension 9 must be even for rotary position "
            "embedding (model.hidden_size 36 / model.num_attention_heads 4); change those sizes "
            "or set model.position to absolute or none");
  c.position = PositionEncoding::kAbsolute;
  EXPECT_EQ(validation_error(c), "");
  c.position = PositionEncoding::kNone;
  EXPECT_EQ(validation_error(c), "");
}

TEST(ModelConfig, RejectsBadValues) {
  auto error_with = [](auto edit) {
    ModelConfig c;
    edit(c);
    return validation_error(c);
  };
  EXPECT_EQ(error_with([](ModelConfig& c) { c.hidden_size = 100; }),
            "model.hidden_size: model.hidden_size (100) must be divisible by "
            "model.num_attention_heads (12)");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.vocab_size = 0; }),
            "model.vocab_size: expected a positive integer, got 0");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.embedding_size = -4; }),
            "model.embedding_size: expected a positive integer, got -4");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.num_hidden_layers = 0; }),
            "model.num_hidden_layers: expected a positive integer, got 0");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.attention_probs_dropout_prob = 1.0; }),
            "model.attention_probs_dropout_prob: expected a number in [0, 1), got 1");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.hidden_dropout_prob = -0.5; }),
            "model.hidden_dropout_prob: expected a number in [0, 1), got -0.5");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.layer_norm_eps = 0.0; }),
            "model.layer_norm_eps: expected a positive number, got 0");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.rope_base = -1.0; }),
            "model.rope_base: expected a positive number, got -1");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.hidden_act = "relu"; }),
            "model.hidden_act: expected \"gelu\" (the erf form) or \"gelu_new\" (the tanh "
            "approximation), got \"relu\"");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.hidden_act = "gelu_new"; }), "");
  EXPECT_EQ(error_with([](ModelConfig& c) { c.pad_token_id = 30522; }),
            "model.pad_token_id: expected an id in [0, model.vocab_size=30522), got 30522");
  EXPECT_EQ(error_with([](ModelConfig& c) {
              c.rotary_value = true;
              c.position = PositionEncoding::kNone;
            }),
            "model.rotary_value: rotary_value needs model.position: rope, got model.position: "
            "none");
}

TEST(ModelConfig, IssueNamesAllKeysInvolved) {
  ModelConfig c;
  c.hidden_size = 100;
  const auto problem = find_model_config_issue(c, "");
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->keys, (std::vector<std::string>{"hidden_size", "num_attention_heads"}));
  EXPECT_EQ(problem->message, "hidden_size (100) must be divisible by num_attention_heads (12)");
}

TEST(ModelConfig, EnumNames) {
  EXPECT_EQ(enum_name(PositionEncoding::kAbsolute), "absolute");
  EXPECT_EQ(enum_from_name<AttentionKind>("linear"), AttentionKind::kLinear);
  EXPECT_FALSE(enum_from_name<RopeLayout>("rotate_half").has_value());
  EXPECT_EQ(enum_choices<PositionEncoding>(), "rope, absolute, none");
  EXPECT_EQ(enum_choices<RopeLayout>(), "interleaved, half");
}

TEST(HfConfigJson, ReadsATransformersConfig) {
  const ModelConfig c = from_hf_config_json(kHfBase);
  EXPECT_EQ(c.vocab_size, 50000);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 12);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.max_position_embeddings, 1536);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-12);
  EXPECT_FALSE(c.embedding_size.has_value());  // 768 == hidden_size: no projection
  EXPECT_EQ(c.position, PositionEncoding::kRope);
  EXPECT_EQ(c.attention, AttentionKind::kSoftmax);
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
  EXPECT_DOUBLE_EQ(c.rope_base, 10000.0);
  ModelConfig expected;
  expected.vocab_size = 50000;
  EXPECT_EQ(c, expected);
}

TEST(HfConfigJson, MissingKeysTakeTransformersDefaults) {
  const ModelConfig c = from_hf_config_json(json{{"model_type", "roformer"}, {"vocab_size", 100}});
  EXPECT_EQ(c.vocab_size, 100);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_FALSE(from_hf_config_json(json{{"embedding_size", nullptr}}).embedding_size.has_value());
}

TEST(HfConfigJson, WritesTransformersKeys) {
  ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  const json j = to_hf_config_json(c);
  EXPECT_EQ(j.at("model_type"), "roformer");
  EXPECT_EQ(j.at("architectures"), json::array({"RoFormerForMaskedLM"}));
  EXPECT_EQ(j.at("embedding_size"), 64);  // written out, as transformers does
  EXPECT_EQ(j.at("hidden_size"), 64);
  EXPECT_EQ(j.at("vocab_size"), 1000);
  EXPECT_EQ(j.at("hidden_act"), "gelu");
  EXPECT_EQ(j.at("rotary_value"), false);
  EXPECT_EQ(j.at("layer_norm_eps"), 1e-12);
  // Nothing transformers would not understand for a plain RoFormer.
  EXPECT_FALSE(j.contains("position"));
  EXPECT_FALSE(j.contains("attention"));
  EXPECT_FALSE(j.contains("rope_base"));
  EXPECT_FALSE(j.contains("rope_layout"));
  EXPECT_FALSE(hf_incompatibility(c).has_value());
}

TEST(HfConfigJson, RoundTripsEveryVariant) {
  ModelConfig plain;
  ModelConfig projected;
  projected.embedding_size = 128;
  ModelConfig variant;
  variant.position = PositionEncoding::kAbsolute;
  variant.attention = AttentionKind::kLinear;
  variant.rope_base = 500000.0;
  variant.rope_layout = RopeLayout::kHalf;
  variant.rotary_value = false;
  variant.hidden_dropout_prob = 0.0;
  variant.type_vocab_size = 1;
  for (const ModelConfig& c : {plain, projected, variant}) {
    const json j = to_hf_config_json(c);
    EXPECT_EQ(from_hf_config_json(json::parse(j.dump())), c) << j.dump(2);
  }
}

TEST(HfConfigJson, ReportsWhatTransformersCannotRun) {
  ModelConfig c;
  c.position = PositionEncoding::kAbsolute;
  EXPECT_EQ(hf_incompatibility(c),
            "model.position is absolute; transformers' RoFormer always uses rotary position "
            "embedding");
  c = ModelConfig{};
  c.attention = AttentionKind::kLinear;
  EXPECT_TRUE(hf_incompatibility(c).has_value());
  c = ModelConfig{};
  c.rope_layout = RopeLayout::kHalf;
  EXPECT_TRUE(hf_incompatibility(c).has_value());
  c = ModelConfig{};
  c.rope_base = 20000.0;
  EXPECT_EQ(hf_incompatibility(c),
            "model.rope_base is 20000; transformers' RoFormer fixes it at 10000");
}

TEST(HfConfigJson, BadFilesNameTheKey) {
  json j = kHfBase;
  j["hidden_size"] = "768";
  EXPECT_EQ(hf_error(j), "hf/config.json: hidden_size: expected an integer, got \"768\"");
  j = kHfBase;
  j["model_type"] = "bert";
  EXPECT_EQ(hf_error(j), "hf/config.json: model_type: expected \"roformer\", got \"bert\"");
  j = kHfBase;
  j["num_attention_heads"] = 7;
  EXPECT_EQ(hf_error(j),
            "hf/config.json: hidden_size: hidden_size (768) must be divisible by "
            "num_attention_heads (7)");
  j = kHfBase;
  j["hidden_act"] = "gelu_pytorch_tanh";  // the same function, a name we do not read
  EXPECT_EQ(hf_error(j),
            "hf/config.json: hidden_act: expected \"gelu\" (the erf form) or \"gelu_new\" (the "
            "tanh approximation), got \"gelu_pytorch_tanh\"");
  j = kHfBase;
  j["position"] = "alibi";
  EXPECT_EQ(hf_error(j),
            "hf/config.json: position: expected one of [rope, absolute, none], got \"alibi\"");
  j = kHfBase;
  j["rotary_value"] = 1;
  EXPECT_EQ(hf_error(j), "hf/config.json: rotary_value: expected true or false, got 1");
  EXPECT_EQ(hf_error(json::array({1, 2})), "hf/config.json: expected a JSON object, got array");
}

}  // namespace
}  // namespace roformer

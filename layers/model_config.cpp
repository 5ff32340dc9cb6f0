#include "layers/model_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace roformer {

template <>
std::span<const EnumEntry<PositionEncoding>> enum_entries<PositionEncoding>() {
  static constexpr EnumEntry<PositionEncoding> kEntries[] = {
      {"rope", PositionEncoding::kRope},
      {"absolute", PositionEncoding::kAbsolute},
      {"none", PositionEncoding::kNone}};
  return kEntries;
}
template <>
std::span<const EnumEntry<AttentionKind>> enum_entries<AttentionKind>() {
  static constexpr EnumEntry<AttentionKind> kEntries[] = {{"softmax", AttentionKind::kSoftmax},
                                                          {"linear", AttentionKind::kLinear}};
  return kEntries;
}
template <>
std::span<const EnumEntry<AttentionKernel>> enum_entries<AttentionKernel>() {
  static constexpr EnumEntry<AttentionKernel> kEntries[] = {
      {"auto", AttentionKernel::kAuto},
      {"fused_rope", AttentionKernel::kFusedRope},
      {"separate", AttentionKernel::kSeparate},
      {"cudnn_sdpa", AttentionKernel::kCudnnSdpa}};
  return kEntries;
}
template <>
std::span<const EnumEntry<RopeLayout>> enum_entries<RopeLayout>() {
  static constexpr EnumEntry<RopeLayout> kEntries[] = {{"interleaved", RopeLayout::kInterleaved},
                                                       {"half", RopeLayout::kHalf}};
  return kEntries;
}

namespace {

constexpr double kHfRopeBase = 10000.0;  // transformers hard-codes this base

ConfigIssue issue(std::vector<std::string> keys, std::string message) {
  return ConfigIssue{std::move(keys), std::move(message)};
}

}  // namespace

std::optional<ConfigIssue> find_model_config_issue(const ModelConfig& c,
                                                   std::string_view key_prefix) {
  const std::string p(key_prefix);
  auto positive = [](const char* key, int64_t v) -> std::optional<ConfigIssue> {
    if (v > 0) return std::nullopt;
    return issue({key}, fmt::format("expected a positive integer, got {}", v));
  };
  auto probability = [](const char* key, double v) -> std::optional<ConfigIssue> {
    if (v >= 0.0 && v < 1.0) return std::nullopt;
    return issue({key}, fmt::format("expected a number in [0, 1), got {}", v));
  };
  auto positive_number = [](const char* key, double v) -> std::optional<ConfigIssue> {
    if (v > 0.0) return std::nullopt;  // also rejects NaN
    return issue({key}, fmt::format("expected a positive number, got {}", v));
  };

  for (auto check :
       {positive("vocab_size", c.vocab_size),
        positive("embedding_size", c.embedding_size.value_or(1)),
        positive("hidden_size", c.hidden_size), positive("num_hidden_layers", c.num_hidden_layers),
        positive("num_attention_heads", c.num_attention_heads),
        positive("intermediate_size", c.intermediate_size),
        positive("max_position_embeddings", c.max_position_embeddings),
        positive("type_vocab_size", c.type_vocab_size),
        probability("hidden_dropout_prob", c.hidden_dropout_prob),
        probability("attention_probs_dropout_prob", c.attention_probs_dropout_prob),
        positive_number("layer_norm_eps", c.layer_norm_eps),
        positive_number("initializer_range", c.initializer_range),
        positive_number("rope_base", c.rope_base)}) {
    if (check) return check;
  }
  if (c.hidden_act != "gelu" && c.hidden_act != "gelu_new")
    return issue({"hidden_act"},
                 fmt::format("expected \"gelu\" (the erf form) or \"gelu_new\" (the tanh "
                             "approximation), got \"{}\"",
                             c.hidden_act));
  if (c.pad_token_id < 0 || c.pad_token_id >= c.vocab_size)
    return issue({"pad_token_id", "vocab_size"},
                 fmt::format("expected an id in [0, {}vocab_size={}), got {}", p, c.vocab_size,
                             c.pad_token_id));
  if (c.hidden_size % c.num_attention_heads != 0)
    return issue({"hidden_size", "num_attention_heads"},
                 fmt::format("{}hidden_size ({}) must be divisible by {}num_attention_heads ({})",
                             p, c.hidden_size, p, c.num_attention_heads));
  if (c.position == PositionEncoding::kRope && c.head_dim() % 2 != 0)
    return issue({"num_attention_heads", "hidden_size", "position"},
                 fmt::format("head dimension {} must be even for rotary position embedding "
                             "({}hidden_size {} / {}num_attention_heads {}); change those sizes or "
                             "set {}position to absolute or none",
                             c.head_dim(), p, c.hidden_size, p, c.num_attention_heads, p));
  if (c.attention_kernel == AttentionKernel::kCudnnSdpa && c.attention == AttentionKind::kSoftmax &&
      c.attention_probs_dropout_prob > 0.0)
    return issue({"attention_kernel", "attention_probs_dropout_prob"},
                 fmt::format("cudnn_sdpa has no attention dropout that follows the shared "
                             "Philox rule: set {}attention_probs_dropout_prob: 0 (got {}) or "
                             "choose another {}attention_kernel",
                             p, c.attention_probs_dropout_prob, p));
  if (c.rotary_value && c.position != PositionEncoding::kRope)
    return issue({"rotary_value", "position"},
                 fmt::format("rotary_value needs {}position: rope, got {}position: {}", p, p,
                             enum_name(c.position)));
  return std::nullopt;
}

void validate_model_config(const ModelConfig& config) {
  if (auto problem = find_model_config_issue(config, "model."))
    throw InputError(fmt::format("model.{}: {}", problem->keys.front(), problem->message));
}

namespace {

// Reads one config.json value into a typed field, naming the key on error.
class JsonReader {
 public:
  JsonReader(const nlohmann::json& json, std::string_view source) : json_(json), source_(source) {}

  [[noreturn]] void fail(std::string_view key, const std::string& message) const {
    throw InputError(fmt::format("{}: {}: {}", source_, key, message));
  }
  const nlohmann::json* find(const char* key) const {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void get(const char* key, int64_t& out) const {
    if (auto* v = find(key)) {
      if (!v->is_number_integer()) fail(key, "expected an integer, got " + v->dump());
      out = v->get<int64_t>();
    }
  }
  void get(const char* key, double& out) const {
    if (auto* v = find(key)) {
      if (!v->is_number()) fail(key, "expected a number, got " + v->dump());
      out = v->get<double>();
    }
  }
  void get(const char* key, bool& out) const {
    if (auto* v = find(key)) {
      if (!v->is_boolean()) fail(key, "expected true or false, got " + v->dump());
      out = v->get<bool>();
    }
  }
  void get(const char* key, std::string& out) const {
    if (auto* v = find(key)) {
      if (!v->is_string()) fail(key, "expected a string, got " + v->dump());
      out = v->get<std::string>();
    }
  }
  template <class E>
  void get_enum(const char* key, E& out) const {
    std::string name;
    get(key, name);
    if (name.empty()) return;
    auto value = enum_from_name<E>(name);
    if (!value) fail(key, fmt::format("expected one of [{}], got \"{}\"", enum_choices<E>(), name));
    out = *value;
  }

 private:
  const nlohmann::json& json_;
  std::string_view source_;
};

}  // namespace

ModelConfig from_hf_config_json(const nlohmann::json& json, std::string_view source) {
  if (!json.is_object())
    throw InputError(fmt::format("{}: expected a JSON object, got {}", source, json.type_name()));
  JsonReader r(json, source);
  std::string model_type;
  r.get("model_type", model_type);
  if (!model_type.empty() && model_type != "roformer")
    r.fail("model_type", fmt::format("expected \"roformer\", got \"{}\"", model_type));

  ModelConfig c;
  r.get("vocab_size", c.vocab_size);
  r.get("hidden_size", c.hidden_size);
  r.get("num_hidden_layers", c.num_hidden_layers);
  r.get("num_attention_heads", c.num_attention_heads);
  r.get("intermediate_size", c.intermediate_size);
  r.get("hidden_act", c.hidden_act);
  r.get("hidden_dropout_prob", c.hidden_dropout_prob);
  r.get("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  r.get("max_position_embeddings", c.max_position_embeddings);
  r.get("type_vocab_size", c.type_vocab_size);
  r.get("layer_norm_eps", c.layer_norm_eps);
  r.get("initializer_range", c.initializer_range);
  r.get("rotary_value", c.rotary_value);
  r.get("pad_token_id", c.pad_token_id);
  // transformers always writes embedding_size out; equal to hidden_size means
  // "no projection", which we keep as unset so both spellings compare equal.
  int64_t embedding_size = 0;
  if (r.find("embedding_size")) {
    r.get("embedding_size", embedding_size);
    if (embedding_size != c.hidden_size) c.embedding_size = embedding_size;
  }
  r.get_enum("position", c.position);
  r.get_enum("attention", c.attention);
  r.get("rope_base", c.rope_base);
  r.get_enum("rope_layout", c.rope_layout);
  r.get_enum("attention_kernel", c.attention_kernel);

  if (auto problem = find_model_config_issue(c, ""))
    r.fail(problem->keys.front(), problem->message);
  return c;
}

nlohmann::json to_hf_config_json(const ModelConfig& c) {
  nlohmann::json j;
  j["architectures"] = nlohmann::json::array({"RoFormerForMaskedLM"});
  j["model_type"] = "roformer";
  j["vocab_size"] = c.vocab_size;
  j["embedding_size"] = c.embedding_dim();
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["intermediate_size"] = c.intermediate_size;
  j["hidden_act"] = c.hidden_act;
  j["hidden_dropout_prob"] = c.hidden_dropout_prob;
  j["attention_probs_dropout_prob"] = c.attention_probs_dropout_prob;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["type_vocab_size"] = c.type_vocab_size;
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["rotary_value"] = c.rotary_value;
  j["pad_token_id"] = c.pad_token_id;
  if (c.position != PositionEncoding::kRope) j["position"] = enum_name(c.position);
  if (c.attention != AttentionKind::kSoftmax) j["attention"] = enum_name(c.attention);
  if (c.rope_base != kHfRopeBase) j["rope_base"] = c.rope_base;
  if (c.rope_layout != RopeLayout::kInterleaved) j["rope_layout"] = enum_name(c.rope_layout);
  if (c.attention_kernel != AttentionKernel::kAuto)
    j["attention_kernel"] = enum_name(c.attention_kernel);
  return j;
}

std::optional<std::string> hf_incompatibility(const ModelConfig& c) {
  if (c.position != PositionEncoding::kRope)
    return fmt::format(
        "model.position is {}; transformers' RoFormer always uses rotary position embedding",
        enum_name(c.position));
  if (c.attention != AttentionKind::kSoftmax)
    return std::string(
        "model.attention is linear; transformers' RoFormer only has softmax attention");
  if (c.rope_base != kHfRopeBase)
    return fmt::format("model.rope_base is {}; transformers' RoFormer fixes it at 10000",
                       c.rope_base);
  if (c.rope_layout != RopeLayout::kInterleaved)
    return std::string(
        "model.rope_layout is half; transformers' RoFormer rotates interleaved pairs");
  return std::nullopt;
}

}  // namespace roformer

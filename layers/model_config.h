// ModelConfig: the RoFormer architecture, with Hugging Face RoFormerConfig key
// names plus our position/attention variants. Kept free of YAML so the model
// code can use it without the config loader (train/config.h parses it).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/rope_layout.h"

namespace roformer {

// Name <-> value tables for the enums that appear in configs. Each enum
// specialises enum_entries<E>(); the helpers below work for all of them.
template <class E>
struct EnumEntry {
  std::string_view name;
  E value;
};
template <class E>
std::span<const EnumEntry<E>> enum_entries();

template <class E>
std::string_view enum_name(E value) {
  for (const auto& e : enum_entries<E>())
    if (e.value == value) return e.name;
  return "<invalid>";
}
template <class E>
std::optional<E> enum_from_name(std::string_view name) {
  for (const auto& e : enum_entries<E>())
    if (e.name == name) return e.value;
  return std::nullopt;
}
// "rope, absolute, none": the allowed values, for error messages and docs.
template <class E>
std::string enum_choices() {
  std::string out;
  for (const auto& e : enum_entries<E>()) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

enum class PositionEncoding { kRope, kAbsolute, kNone };
enum class AttentionKind { kSoftmax, kLinear };
// Where softmax attention applies RoPE to q and k: inside the attention op
// (rope_attention: on token streams by default q and k rotated once around
// the plain kernels, set_rotate_once in core/ops.h; otherwise CUDA rotates
// tiles as they load, no rotated copies), as separate rope ops before it,
// or auto (inside on an accelerator,
// separate on the CPU, where the fused op composes the same kernels);
// cudnn_sdpa: separate rope ops, then cuDNN's fused attention (CUDA, bf16,
// padded batches, no attention dropout).
enum class AttentionKernel { kAuto, kFusedRope, kSeparate, kCudnnSdpa };
// RopeLayout (kInterleaved | kHalf) comes from core/rope_layout.h, shared with the rope op.

template <>
std::span<const EnumEntry<PositionEncoding>> enum_entries<PositionEncoding>();
template <>
std::span<const EnumEntry<AttentionKind>> enum_entries<AttentionKind>();
template <>
std::span<const EnumEntry<RopeLayout>> enum_entries<RopeLayout>();
template <>
std::span<const EnumEntry<AttentionKernel>> enum_entries<AttentionKernel>();

struct ModelConfig {
  // Hugging Face RoFormerConfig keys, same defaults as transformers except
  // max_position_embeddings (1536: the paper's longest stage).
  int64_t vocab_size = 30522;
  std::optional<int64_t> embedding_size;  // unset: equal to hidden_size (no projection)
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  std::string hidden_act = "gelu";  // "gelu" (erf) or "gelu_new" (tanh approximation)
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  int64_t max_position_embeddings = 1536;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;
  bool rotary_value = false;  // also rotate V (transformers' option; the paper rotates Q, K only)
  int64_t pad_token_id = 0;
  // Ours.
  PositionEncoding position = PositionEncoding::kRope;
  AttentionKind attention = AttentionKind::kSoftmax;
  double rope_base = 10000.0;
  RopeLayout rope_layout = RopeLayout::kInterleaved;
  AttentionKernel attention_kernel = AttentionKernel::kAuto;  // how, not what: same numbers

  // Width of the embedding table: embedding_size, or hidden_size when unset.
  int64_t embedding_dim() const { return embedding_size.value_or(hidden_size); }
  // Per-head width; only meaningful for a valid config.
  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  bool operator==(const ModelConfig&) const = default;
};

// A problem found by validation: the keys involved (relative to the model
// section, the one to blame first) and a message without location. Loaders
// attach file positions to the first key the user actually set.
struct ConfigIssue {
  std::vector<std::string> keys;
  std::string message;
};

// The first problem with `config`, or nullopt when it is valid. Messages name
// other keys with `key_prefix` ("model." in YAML configs, "" for config.json).
std::optional<ConfigIssue> find_model_config_issue(const ModelConfig& config,
                                                   std::string_view key_prefix = "model.");
// Throws InputError("model.<key>: <message>") when the config is invalid.
void validate_model_config(const ModelConfig& config);

// From a Hugging Face RoFormer config.json. Keys that transformers adds to
// every config (architectures, torch_dtype, ...) are ignored; our own
// position/attention/rope_* keys are read when present. `source` names the
// file in error messages. Throws InputError for wrong types or bad values.
ModelConfig from_hf_config_json(const nlohmann::json& json,
                                std::string_view source = "config.json");
// To a config.json that transformers' RoFormerConfig loads (model_type
// "roformer", embedding_size written out as transformers does). Our
// extensions are added only when they differ from what transformers does, so
// from_hf_config_json(to_hf_config_json(c)) == c.
nlohmann::json to_hf_config_json(const ModelConfig& config);
// Why transformers' RoFormer could not run this model the same way (e.g.
// position: absolute), or nullopt when it can.
std::optional<std::string> hf_incompatibility(const ModelConfig& config);

}  // namespace roformer

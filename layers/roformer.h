// The RoFormer encoder and its heads, shaped and named as Hugging Face's
// modeling_roformer.py (RoFormerModel, RoFormerForMaskedLM,
// RoFormerForSequenceClassification), so a state dict moves between the two
// without renames. Post-LN layers as in BERT:
//   embeddings: LN(word[ids] + type[types] (+ position table)) -> dropout
//   (-> embeddings_project when embedding_size != hidden_size)
//   layer: x = LN(x + dropout(dense(attention(x)))); x = LN(x + dropout(dense(gelu(dense(x)))))
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "layers/attention.h"
#include "layers/basic.h"
#include "layers/model_config.h"

namespace roformer {

// roformer.embeddings.*
class RoFormerEmbeddings : public Module {
 public:
  explicit RoFormerEmbeddings(const ModelConfig& config);
  // ids [B, S] (i32/i64), token_types [B, S] or undefined (all 0) -> [B, S, E].
  Tensor forward(const Tensor& ids, const Tensor& token_types, bool training,
                 DropoutContext& ctx) const;
  // Token stream: ids [T], token_types [T] or undefined -> [T, E]; absolute
  // position embeddings (if any) at the layout's positions.
  Tensor forward(const Tensor& ids, const Tensor& token_types, const TokenLayout& layout,
                 bool training, DropoutContext& ctx) const;
  const Embedding& word_embeddings() const { return word_embeddings_; }

 private:
  ModelConfig config_;
  Embedding word_embeddings_, token_type_embeddings_;
  std::unique_ptr<Embedding> position_embeddings_;  // position: absolute only
  LayerNorm layer_norm_;
  Dropout dropout_;
};

// dense -> dropout -> LayerNorm(. + residual): attention.output and output.
class RoFormerResidualOutput : public Module {
 public:
  RoFormerResidualOutput(const ModelConfig& config, int64_t in_features);
  // dropout_tokens: the layout's [T, 2] keys for a token-stream x (else undefined).
  Tensor forward(const Tensor& x, const Tensor& residual, bool training, DropoutContext& ctx,
                 const Tensor& dropout_tokens = Tensor()) const;
  // The same from dense's output, computed by the caller (a fused op).
  Tensor finish(const Tensor& dense_out, const Tensor& residual, bool training, DropoutContext& ctx,
                const Tensor& dropout_tokens = Tensor()) const;
  const Linear& dense() const { return dense_; }

 private:
  Linear dense_;
  LayerNorm layer_norm_;
  Dropout dropout_;
};

// roformer.encoder.layer.{i}.*
class RoFormerLayer : public Module {
 public:
  explicit RoFormerLayer(const ModelConfig& config);
  Tensor forward(const Tensor& hidden, const Tensor& key_mask, const Tensor& positions,
                 bool training, DropoutContext& ctx) const;
  // Token stream: hidden [T, hidden] -> [T, hidden].
  Tensor forward(const Tensor& hidden, const TokenLayout& layout, bool training,
                 DropoutContext& ctx) const;
  const RoFormerSelfAttention& self_attention() const { return self_; }
  void set_rope_base(double base) { self_.set_rope_base(base); }

 private:
  class Attention : public Module {
   public:
    Attention(RoFormerSelfAttention& self, RoFormerResidualOutput& output) {
      register_module("self", self);
      register_module("output", output);
    }
  };
  class Intermediate : public Module {
   public:
    explicit Intermediate(Linear& dense) { register_module("dense", dense); }
  };

  // intermediate -> activation -> output, with the residual and LayerNorm.
  Tensor feed_forward(const Tensor& attended, bool training, DropoutContext& ctx,
                      const Tensor& dropout_tokens) const;

  RoFormerSelfAttention self_;
  RoFormerResidualOutput attention_output_;
  Attention attention_;
  Linear intermediate_dense_;
  Intermediate intermediate_;
  RoFormerResidualOutput output_;
  bool tanh_gelu_;  // hidden_act gelu_new: the fused gelu_tanh_ffn
};

// roformer.*: embeddings (+ embeddings_project) and the encoder stack.
class RoFormerModel : public Module {
 public:
  explicit RoFormerModel(const ModelConfig& config);
  // ids [B, S] i32/i64; token_types [B, S] or undefined; attention_mask [B, S]
  // (1 = token, 0 = padding) or undefined -> last hidden state [B, S, hidden].
  // Positions are 0..S-1 in every row.
  Tensor forward(const Tensor& ids, const Tensor& token_types, const Tensor& attention_mask,
                 bool training, DropoutContext& ctx) const;
  // Unpadded: ids [T] (and token_types [T] or undefined) laid out by `layout`
  // -> last hidden state [T, hidden]. On the real tokens it equals the padded
  // forward's output (to float rounding), dropout included.
  Tensor forward(const Tensor& ids, const Tensor& token_types, const TokenLayout& layout,
                 bool training, DropoutContext& ctx) const;
  const ModelConfig& config() const { return config_; }
  const RoFormerEmbeddings& embeddings() const { return embeddings_; }
  const RoFormerLayer& layer(int64_t i) const { return *layers_.at(size_t(i)); }
  // The RoPE base of every layer (and of config()): per-stage rope_base.
  void set_rope_base(double base) {
    config_.rope_base = base;
    for (auto& layer : layers_) layer->set_rope_base(base);
  }

 private:
  class Encoder : public Module {
   public:
    void add(const std::string& name, Module& m) { register_module(name, m); }
  };
  class LayerList : public Module {
   public:
    void add(const std::string& name, Module& m) { register_module(name, m); }
  };

  ModelConfig config_;
  RoFormerEmbeddings embeddings_;
  std::unique_ptr<Linear> embeddings_project_;
  std::vector<std::unique_ptr<RoFormerLayer>> layers_;
  LayerList layer_list_;
  Encoder encoder_;
};

// cls.predictions.*: dense (hidden -> E) -> GELU -> LayerNorm -> decoder tied
// to the word embedding [V, E] + bias [V].
class RoFormerLMHead : public Module {
 public:
  RoFormerLMHead(const ModelConfig& config, const Embedding& word_embeddings);
  // Logits [N, V] of hidden rows [N, hidden].
  Tensor forward(const Tensor& rows) const;
  // Logits [N, V] at flat positions (b * S + s) of hidden [B, S, hidden]
  // (every position when `positions` is undefined).
  Tensor logits(const Tensor& hidden, const Tensor& positions) const;

 protected:
  void init_own(Generator& gen) override;

 private:
  class Transform : public Module {
   public:
    Transform(Linear& dense, LayerNorm& ln) {
      register_module("dense", dense);
      register_module("LayerNorm", ln);
    }
  };
  const Embedding& word_embeddings_;
  Linear dense_;
  LayerNorm layer_norm_;
  Transform transform_;
  Tensor bias_;
  bool tanh_gelu_;
};

struct MlmOutput {
  Tensor loss;             // scalar mean cross-entropy over masked rows (with history)
  int64_t num_masked = 0;  // rows whose label != -100
  // Of those, the rows whose argmax logit is the label: a scalar i64 on the
  // model's device, so computing it waits for nothing.
  Tensor correct;
  // The loss and the correct rows, read back together: one wait for the
  // device (after the backward is queued, so it does not stall it).
  std::pair<double, int64_t> read() const;
};

// roformer.* + cls.predictions.*
class RoFormerForMaskedLM : public Module {
 public:
  // Builds the model and initialises it from Philox(seed) (BERT's scheme).
  RoFormerForMaskedLM(const ModelConfig& config, uint64_t seed);

  // MLM loss over the rows whose label != -100 (labels [B, S] i32/i64). The
  // head runs only on those rows. With no labelled row the loss is a zero
  // that still backpropagates (zero gradients).
  MlmOutput forward_mlm(const Tensor& input_ids, const Tensor& token_type_ids,
                        const Tensor& attention_mask, const Tensor& labels, bool training,
                        DropoutContext& ctx) const;
  // The same on a token stream: input_ids, token_type_ids, labels [T].
  MlmOutput forward_mlm(const Tensor& input_ids, const Tensor& token_type_ids,
                        const TokenLayout& layout, const Tensor& labels, bool training,
                        DropoutContext& ctx) const;
  // Prediction (no dropout, no history): logits [N, V] at flat positions
  // rows (b * S + s), or at every position ([B * S, V]) when rows is undefined.
  Tensor mlm_logits(const Tensor& input_ids, const Tensor& token_type_ids,
                    const Tensor& attention_mask, const Tensor& rows = Tensor()) const;

  const ModelConfig& config() const { return roformer_.config(); }
  const RoFormerModel& roformer() const { return roformer_; }
  const RoFormerLMHead& lm_head() const { return head_; }
  void set_rope_base(double base) { roformer_.set_rope_base(base); }

 private:
  // The rows of `labels` (flat token order) to predict and their targets,
  // already on the model's device.
  struct MaskedRows {
    Tensor rows, targets;  // [M] i64
    int64_t count = 0;
  };
  MaskedRows masked_rows(const Tensor& labels, const Shape& ids, Device device) const;
  MlmOutput mlm_loss(const Tensor& hidden_rows, const MaskedRows& masked) const;
  class Cls : public Module {
   public:
    explicit Cls(RoFormerLMHead& head) { register_module("predictions", head); }
  };
  RoFormerModel roformer_;
  RoFormerLMHead head_;
  Cls cls_;
};

// classifier.*: first token -> dropout -> dense -> GELU -> dropout -> out_proj,
// as Hugging Face's RoFormerClassificationHead.
class RoFormerClassificationHead : public Module {
 public:
  RoFormerClassificationHead(const ModelConfig& config, int64_t num_labels);
  // hidden [B, S, hidden] -> logits [B, num_labels].
  Tensor forward(const Tensor& hidden, bool training, DropoutContext& ctx) const;
  // first_tokens [N, hidden] (each sequence's [CLS] state) -> logits [N, num_labels].
  Tensor forward_first_tokens(const Tensor& first_tokens, bool training, DropoutContext& ctx) const;

 private:
  Linear dense_, out_proj_;
  Dropout dropout_;
  bool tanh_gelu_;
};

struct ClassificationOutput {
  Tensor loss;              // scalar (undefined without labels)
  Tensor logits;            // [B, num_labels]
  int64_t num_correct = 0;  // argmax == label (classification with labels)
};

// roformer.* + classifier.*; num_labels == 1 is regression (MSE on float
// labels), otherwise cross-entropy on class ids (-100 ignored).
class RoFormerForSequenceClassification : public Module {
 public:
  RoFormerForSequenceClassification(const ModelConfig& config, int64_t num_labels, uint64_t seed);
  ClassificationOutput forward(const Tensor& input_ids, const Tensor& token_type_ids,
                               const Tensor& attention_mask, const Tensor& labels, bool training,
                               DropoutContext& ctx) const;
  // Token stream: one example per document of `layout` (labels [documents]
  // or undefined); logits [documents, num_labels] from each document's first token.
  ClassificationOutput forward(const Tensor& input_ids, const Tensor& token_type_ids,
                               const TokenLayout& layout, const Tensor& labels, bool training,
                               DropoutContext& ctx) const;
  int64_t num_labels() const { return num_labels_; }
  const RoFormerModel& roformer() const { return roformer_; }

 private:
  ClassificationOutput with_loss(ClassificationOutput out, const Tensor& labels) const;
  int64_t num_labels_;
  RoFormerModel roformer_;
  RoFormerClassificationHead classifier_;
};

}  // namespace roformer

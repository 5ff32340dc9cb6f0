#include "layers/roformer.h"

#include <cmath>
#include <utility>

#include "core/precision.h"
#include "core/profile.h"

namespace roformer {

namespace {

const ModelConfig& validated(const ModelConfig& config) {
  validate_model_config(config);
  return config;
}

int64_t checked_num_labels(int64_t num_labels) {
  if (num_labels < 1)
    throw InputError(detail::concat(
        "RoFormerForSequenceClassification: num_labels must be >= 1, got ", num_labels));
  return num_labels;
}

// hidden_act: "gelu" is the erf GELU; "gelu_new" the tanh approximation,
// here written out with elementwise ops (the heads; the layers' FFN runs it
// fused in gelu_tanh_ffn).
Tensor activation_profiled(const Tensor& x, bool tanh_gelu) {
  RF_PROFILE("gelu");
  if (!tanh_gelu) return gelu(x);
  const Tensor u = mul(add(x, mul(pow(x, 3.0), 0.044715)), 0.79788456080286535588);
  return mul(mul(x, 0.5), add(tanh(u), 1.0));
}

bool tanh_gelu(const ModelConfig& config) {
  return config.hidden_act == "gelu_new";
}

// Host copy of a [B, S]-shaped integer tensor, checked against the ids' shape.
std::vector<int64_t> host_ints(const Tensor& t, const Shape& expected, const char* what) {
  if (t.shape() != expected)
    throw Error(detail::concat("RoFormer: ", what, " ", t.desc(), " does not match input_ids ",
                               shape_str(expected)));
  return t.to_vector<int64_t>();
}

}  // namespace

// --- embeddings --------------------------------------------------------------------

RoFormerEmbeddings::RoFormerEmbeddings(const ModelConfig& config)
    : config_(config),
      word_embeddings_(config.vocab_size, config.embedding_dim(), config.initializer_range,
                       config.pad_token_id),
      token_type_embeddings_(config.type_vocab_size, config.embedding_dim(),
                             config.initializer_range),
      layer_norm_(config.embedding_dim(), config.layer_norm_eps),
      dropout_(config.hidden_dropout_prob) {
  register_module("word_embeddings", word_embeddings_);
  register_module("token_type_embeddings", token_type_embeddings_);
  if (config.position == PositionEncoding::kAbsolute) {
    position_embeddings_ = std::make_unique<Embedding>(
        config.max_position_embeddings, config.embedding_dim(), config.initializer_range);
    register_module("position_embeddings", *position_embeddings_);
  }
  register_module("LayerNorm", layer_norm_);
}

Tensor RoFormerEmbeddings::forward(const Tensor& ids, const Tensor& token_types, bool training,
                                   DropoutContext& ctx) const {
  if (ids.dim() != 2)
    throw Error(detail::concat("RoFormerEmbeddings: expected input_ids [B, S], got ", ids.desc()));
  const int64_t B = ids.size(0), S = ids.size(1);
  Tensor x = word_embeddings_.forward(ids);
  {
    const Tensor types =
        token_types.defined() ? token_types : Tensor::zeros({B, S}, DType::i32, ids.device());
    const Tensor type_emb = token_type_embeddings_.forward(types);
    RF_PROFILE("add");
    x = add(x, type_emb);
  }
  if (position_embeddings_) {
    if (S > config_.max_position_embeddings)
      throw Error(detail::concat("RoFormerEmbeddings: sequence length ", S,
                                 " exceeds max_position_embeddings ",
                                 config_.max_position_embeddings));
    const Tensor pos =
        position_embeddings_->forward(Tensor::arange(0, S, DType::i64, ids.device()));  // [S, E]
    RF_PROFILE("add");
    x = add(x, pos);
  }
  return dropout_.forward(layer_norm_.forward(x), training, ctx);
}

Tensor RoFormerEmbeddings::forward(const Tensor& ids, const Tensor& token_types,
                                   const TokenLayout& layout, bool training,
                                   DropoutContext& ctx) const {
  if (ids.dim() != 1 || ids.size(0) != layout.num_tokens)
    throw Error(detail::concat("RoFormerEmbeddings: expected input_ids [T] with T = ",
                               layout.num_tokens, " (the layout's tokens), got ", ids.desc()));
  Tensor x = word_embeddings_.forward(ids);
  {
    const Tensor types = token_types.defined()
                             ? token_types
                             : Tensor::zeros({layout.num_tokens}, DType::i32, ids.device());
    const Tensor type_emb = token_type_embeddings_.forward(types);
    RF_PROFILE("add");
    x = add(x, type_emb);
  }
  if (position_embeddings_) {
    const Tensor pos = position_embeddings_->forward(layout.positions);  // [T, E]
    RF_PROFILE("add");
    x = add(x, pos);
  }
  return dropout_.forward(layer_norm_.forward(x), training, ctx, layout.tokens);
}

// --- encoder layer -------------------------------------------------------------------

RoFormerResidualOutput::RoFormerResidualOutput(const ModelConfig& config, int64_t in_features)
    : dense_(in_features, config.hidden_size, true, config.initializer_range),
      layer_norm_(config.hidden_size, config.layer_norm_eps),
      dropout_(config.hidden_dropout_prob) {
  register_module("dense", dense_);
  register_module("LayerNorm", layer_norm_);
}

Tensor RoFormerResidualOutput::forward(const Tensor& x, const Tensor& residual, bool training,
                                       DropoutContext& ctx, const Tensor& dropout_tokens) const {
  // bf16 activations under autocast: the product writes bf16, which the
  // residual layer norm reads, dropping it as it adds the residual (one pass,
  // dropout_add_layer_norm); the layer norm writes f32.
  return finish(dense_.forward(x, activation_dtype(x)), residual, training, ctx, dropout_tokens);
}

Tensor RoFormerResidualOutput::finish(const Tensor& dense_out, const Tensor& residual,
                                      bool training, DropoutContext& ctx,
                                      const Tensor& dropout_tokens) const {
  return layer_norm_.forward(dense_out, residual, dropout_, training, ctx, dropout_tokens);
}

RoFormerLayer::RoFormerLayer(const ModelConfig& config)
    : self_(config),
      attention_output_(config, config.hidden_size),
      attention_(self_, attention_output_),
      intermediate_dense_(config.hidden_size, config.intermediate_size, true,
                          config.initializer_range),
      intermediate_(intermediate_dense_),
      output_(config, config.intermediate_size),
      tanh_gelu_(tanh_gelu(config)) {
  register_module("attention", attention_);
  register_module("intermediate", intermediate_);
  register_module("output", output_);
}

Tensor RoFormerLayer::forward(const Tensor& hidden, const Tensor& key_mask, const Tensor& positions,
                              bool training, DropoutContext& ctx) const {
  const Tensor context = self_.forward(hidden, key_mask, positions, training, ctx);
  const Tensor attended = attention_output_.forward(context, hidden, training, ctx);
  return feed_forward(attended, training, ctx, Tensor());
}

Tensor RoFormerLayer::forward(const Tensor& hidden, const TokenLayout& layout, bool training,
                              DropoutContext& ctx) const {
  const Tensor context = self_.forward(hidden, layout, training, ctx);
  const Tensor attended = attention_output_.forward(context, hidden, training, ctx, layout.tokens);
  return feed_forward(attended, training, ctx, layout.tokens);
}

Tensor RoFormerLayer::feed_forward(const Tensor& attended, bool training, DropoutContext& ctx,
                                   const Tensor& dropout_tokens) const {
  if (!tanh_gelu_) {
    const Tensor inner = activation_profiled(
        intermediate_dense_.forward(attended, activation_dtype(attended)), false);
    return output_.forward(inner, attended, training, ctx, dropout_tokens);
  }
  Tensor y;
  {
    RF_PROFILE("ffn");  // both products and the GELU in one op (GEMM epilogues on CUDA)
    const Linear& out = output_.dense();
    y = gelu_tanh_ffn(attended, intermediate_dense_.weight(), intermediate_dense_.bias(),
                      out.weight(), out.bias(), activation_dtype(attended));
  }
  return output_.finish(y, attended, training, ctx, dropout_tokens);
}

// --- model -----------------------------------------------------------------------------

RoFormerModel::RoFormerModel(const ModelConfig& config)
    : config_(validated(config)), embeddings_(config) {
  register_module("embeddings", embeddings_);
  if (config.embedding_dim() != config.hidden_size) {
    embeddings_project_ = std::make_unique<Linear>(config.embedding_dim(), config.hidden_size, true,
                                                   config.initializer_range);
    register_module("embeddings_project", *embeddings_project_);
  }
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers_.push_back(std::make_unique<RoFormerLayer>(config));
    layer_list_.add(std::to_string(i), *layers_.back());
  }
  encoder_.add("layer", layer_list_);
  register_module("encoder", encoder_);
}

Tensor RoFormerModel::forward(const Tensor& ids, const Tensor& token_types,
                              const Tensor& attention_mask, bool training,
                              DropoutContext& ctx) const {
  if (ids.dim() != 2)
    throw Error(detail::concat("RoFormerModel: expected input_ids [B, S], got ", ids.desc()));
  const int64_t S = ids.size(1);
  if (token_types.defined() && token_types.shape() != ids.shape())
    throw Error(detail::concat("RoFormerModel: token_type_ids ", token_types.desc(),
                               " do not match input_ids ", ids.desc()));
  if (attention_mask.defined() && attention_mask.shape() != ids.shape())
    throw Error(detail::concat("RoFormerModel: attention_mask ", attention_mask.desc(),
                               " does not match input_ids ", ids.desc()));
  Tensor x = embeddings_.forward(ids, token_types, training, ctx);
  if (embeddings_project_) x = embeddings_project_->forward(x);
  const Tensor positions = Tensor::arange(0, S, DType::i64, ids.device());
  for (const auto& layer : layers_) x = layer->forward(x, attention_mask, positions, training, ctx);
  return x;
}

Tensor RoFormerModel::forward(const Tensor& ids, const Tensor& token_types,
                              const TokenLayout& layout, bool training, DropoutContext& ctx) const {
  if (token_types.defined() && token_types.shape() != ids.shape())
    throw Error(detail::concat("RoFormerModel: token_type_ids ", token_types.desc(),
                               " do not match input_ids ", ids.desc()));
  Tensor x = embeddings_.forward(ids, token_types, layout, training, ctx);
  if (embeddings_project_) x = embeddings_project_->forward(x);
  for (const auto& layer : layers_) x = layer->forward(x, layout, training, ctx);
  return x;
}

// --- MLM head ----------------------------------------------------------------------------

RoFormerLMHead::RoFormerLMHead(const ModelConfig& config, const Embedding& word_embeddings)
    : word_embeddings_(word_embeddings),
      dense_(config.hidden_size, config.embedding_dim(), true, config.initializer_range),
      layer_norm_(config.embedding_dim(), config.layer_norm_eps),
      transform_(dense_, layer_norm_),
      tanh_gelu_(tanh_gelu(config)) {
  bias_ = register_parameter("bias", Tensor::zeros({config.vocab_size}));
  register_module("transform", transform_);
}

void RoFormerLMHead::init_own(Generator&) {
  bias_.zero_();
}

Tensor RoFormerLMHead::forward(const Tensor& rows) const {
  // The transform in bf16 activations under autocast; the layer norm writes
  // f32. The decoder writes bf16 logits there too, as torch's autocast does:
  // the loss reads them in f32 arithmetic, and their gradient (bf16 as well)
  // is what the decoder's products would have cast it to. At RoFormer-base's
  // vocabulary that halves the largest tensor of the head, [masked, 50,000].
  const Tensor h = layer_norm_.forward(
      activation_profiled(dense_.forward(rows, activation_dtype(rows)), tanh_gelu_));
  RF_PROFILE("decoder");
  return linear(h, word_embeddings_.weight(), bias_, activation_dtype(h));
}

Tensor RoFormerLMHead::logits(const Tensor& hidden, const Tensor& positions) const {
  if (hidden.dim() != 3)
    throw Error(detail::concat("RoFormerLMHead: expected hidden [B, S, H], got ", hidden.desc()));
  const Tensor flat = hidden.reshape({hidden.size(0) * hidden.size(1), hidden.size(2)});
  if (!positions.defined()) return forward(flat);
  Tensor rows;
  {
    RF_PROFILE("index_select");
    rows = index_select(flat, positions);
  }
  return forward(rows);
}

// --- masked LM ----------------------------------------------------------------------------

RoFormerForMaskedLM::RoFormerForMaskedLM(const ModelConfig& config, uint64_t seed)
    : roformer_(config), head_(config, roformer_.embeddings().word_embeddings()), cls_(head_) {
  register_module("roformer", roformer_);
  register_module("cls", cls_);
  Generator gen{seed, 0};
  reset_parameters(gen);
  flatten_parameters();
}

// The masked rows go to the device before the encoder is queued: a pageable
// host-to-device copy of more than a few KB waits for the work queued before
// it on its stream, which after the encoder would be the whole forward.
MlmOutput RoFormerForMaskedLM::forward_mlm(const Tensor& input_ids, const Tensor& token_type_ids,
                                           const Tensor& attention_mask, const Tensor& labels,
                                           bool training, DropoutContext& ctx) const {
  const MaskedRows masked = masked_rows(labels, input_ids.shape(), input_ids.device());
  const Tensor hidden = roformer_.forward(input_ids, token_type_ids, attention_mask, training, ctx);
  return mlm_loss(hidden.reshape({-1, hidden.size(-1)}), masked);
}

MlmOutput RoFormerForMaskedLM::forward_mlm(const Tensor& input_ids, const Tensor& token_type_ids,
                                           const TokenLayout& layout, const Tensor& labels,
                                           bool training, DropoutContext& ctx) const {
  const MaskedRows masked = masked_rows(labels, input_ids.shape(), input_ids.device());
  return mlm_loss(roformer_.forward(input_ids, token_type_ids, layout, training, ctx), masked);
}

RoFormerForMaskedLM::MaskedRows RoFormerForMaskedLM::masked_rows(const Tensor& labels,
                                                                 const Shape& ids,
                                                                 Device device) const {
  const std::vector<int64_t> label = host_ints(labels, ids, "labels");
  std::vector<int64_t> rows, targets;
  for (size_t i = 0; i < label.size(); ++i) {
    if (label[i] == -100) continue;
    if (label[i] < 0 || label[i] >= config().vocab_size)
      throw InputError(detail::concat("forward_mlm: label ", label[i], " at position ", i,
                                      " is outside [0, vocab_size=", config().vocab_size,
                                      ") and is not -100"));
    rows.push_back(int64_t(i));
    targets.push_back(label[i]);
  }
  MaskedRows out;
  out.count = int64_t(rows.size());
  if (out.count == 0) return out;
  // The labels may come from the host (the trainer keeps them there); the
  // rows and targets go where the model runs.
  out.rows = Tensor::from_vector(rows, {out.count}, device);
  out.targets = Tensor::from_vector(targets, {out.count}, device);
  return out;
}

// Loss over the masked rows of hidden_rows [N, hidden] (flat token order).
MlmOutput RoFormerForMaskedLM::mlm_loss(const Tensor& hidden, const MaskedRows& masked) const {
  MlmOutput out;
  out.num_masked = masked.count;
  if (masked.count == 0) {
    out.loss = mul(sum(hidden), 0.0);
    out.correct = Tensor::zeros({}, DType::i64, hidden.device());
    return out;
  }
  Tensor selected;
  {
    RF_PROFILE("index_select");
    selected = index_select(hidden, masked.rows);
  }
  const Tensor logits = head_.forward(selected);  // [M, V]
  RF_PROFILE("cross_entropy");
  // The loss's one pass over the logits also counts the rows whose argmax
  // is the target, on the device.
  CrossEntropyOutputs ce = cross_entropy_with_counts(logits, masked.targets);
  out.loss = std::move(ce.loss);
  out.correct = std::move(ce.correct);
  return out;
}

std::pair<double, int64_t> MlmOutput::read() const {
  if (!loss.defined()) return {0.0, 0};
  NoGradGuard no_grad;
  // In the loss's precision (f64 runs keep theirs; bf16 widens to f32).
  const DType dtype = loss.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor c =
      correct.defined() ? cast(correct, dtype) : Tensor::zeros({}, dtype, loss.device());
  const std::vector<double> both = stack({cast(loss.detach(), dtype), c}, 0).to_vector<double>();
  return {both[0], int64_t(std::llround(both[1]))};
}

Tensor RoFormerForMaskedLM::mlm_logits(const Tensor& input_ids, const Tensor& token_type_ids,
                                       const Tensor& attention_mask, const Tensor& rows) const {
  NoGradGuard no_grad;
  DropoutContext unused;
  const Tensor hidden = roformer_.forward(input_ids, token_type_ids, attention_mask, false, unused);
  return head_.logits(hidden, rows);
}

// --- sequence classification -----------------------------------------------------------------

RoFormerClassificationHead::RoFormerClassificationHead(const ModelConfig& config,
                                                       int64_t num_labels)
    : dense_(config.hidden_size, config.hidden_size, true, config.initializer_range),
      out_proj_(config.hidden_size, num_labels, true, config.initializer_range),
      dropout_(config.hidden_dropout_prob),
      tanh_gelu_(tanh_gelu(config)) {
  register_module("dense", dense_);
  register_module("out_proj", out_proj_);
}

Tensor RoFormerClassificationHead::forward(const Tensor& hidden, bool training,
                                           DropoutContext& ctx) const {
  return forward_first_tokens(hidden.select(1, 0), training, ctx);  // the [CLS] tokens
}

Tensor RoFormerClassificationHead::forward_first_tokens(const Tensor& first_tokens, bool training,
                                                        DropoutContext& ctx) const {
  // [N, hidden]: one position per row, so dropout keys row n as the padded head does.
  Tensor x = dropout_.forward(first_tokens, training, ctx);
  const DType logits_dtype = x.dtype();
  x = activation_profiled(dense_.forward(x, activation_dtype(x)), tanh_gelu_);
  x = dropout_.forward(x, training, ctx);
  return out_proj_.forward(x, logits_dtype);
}

RoFormerForSequenceClassification::RoFormerForSequenceClassification(const ModelConfig& config,
                                                                     int64_t num_labels,
                                                                     uint64_t seed)
    : num_labels_(checked_num_labels(num_labels)),
      roformer_(config),
      classifier_(config, num_labels) {
  register_module("roformer", roformer_);
  register_module("classifier", classifier_);
  Generator gen{seed, 0};
  reset_parameters(gen);
  flatten_parameters();
}

ClassificationOutput RoFormerForSequenceClassification::forward(const Tensor& input_ids,
                                                                const Tensor& token_type_ids,
                                                                const Tensor& attention_mask,
                                                                const Tensor& labels, bool training,
                                                                DropoutContext& ctx) const {
  const Tensor hidden = roformer_.forward(input_ids, token_type_ids, attention_mask, training, ctx);
  ClassificationOutput out;
  out.logits = classifier_.forward(hidden, training, ctx);
  return with_loss(std::move(out), labels);
}

ClassificationOutput RoFormerForSequenceClassification::forward(const Tensor& input_ids,
                                                                const Tensor& token_type_ids,
                                                                const TokenLayout& layout,
                                                                const Tensor& labels, bool training,
                                                                DropoutContext& ctx) const {
  const Tensor hidden = roformer_.forward(input_ids, token_type_ids, layout, training, ctx);
  ClassificationOutput out;
  out.logits =
      classifier_.forward_first_tokens(index_select(hidden, layout.document_firsts), training, ctx);
  return with_loss(std::move(out), labels);
}

ClassificationOutput RoFormerForSequenceClassification::with_loss(ClassificationOutput out,
                                                                  const Tensor& labels) const {
  if (!labels.defined()) return out;
  const int64_t B = out.logits.size(0);
  if (labels.dim() != 1 || labels.size(0) != B)
    throw Error(detail::concat("RoFormerForSequenceClassification: labels ", labels.desc(),
                               " do not match the batch of ", B));
  if (num_labels_ == 1) {
    const Tensor diff = sub(out.logits.select(1, 0), labels.to(out.logits.dtype()));
    out.loss = mean(mul(diff, diff));
    return out;
  }
  const std::vector<int64_t> label = labels.to_vector<int64_t>();
  for (int64_t l : label)
    if (l != -100 && (l < 0 || l >= num_labels_))
      throw InputError(detail::concat("RoFormerForSequenceClassification: label ", l,
                                      " is outside [0, ", num_labels_, ")"));
  out.loss = cross_entropy(out.logits, labels.to(DType::i64));
  const std::vector<int64_t> best = argmax(out.logits.detach(), 1).to_vector<int64_t>();
  for (size_t i = 0; i < best.size(); ++i) out.num_correct += best[i] == label[i];
  return out;
}

}  // namespace roformer

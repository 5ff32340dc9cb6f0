#include "layers/basic.h"

#include "core/profile.h"

namespace roformer {

namespace {
// Fills t in place with normal(0, std) from gen (no history).
void fill_normal(Tensor t, double std, Generator& gen) {
  NoGradGuard no_grad;
  t.copy_(Tensor::randn(t.shape(), gen, DType::f64) * std);
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, double init_std)
    : init_std_(init_std) {
  if (in_features <= 0 || out_features <= 0)
    throw Error(detail::concat("Linear: sizes must be positive, got in ", in_features, ", out ",
                               out_features));
  weight_ = register_parameter("weight", Tensor::zeros({out_features, in_features}));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}));
}

Tensor Linear::forward(const Tensor& x) const {
  RF_PROFILE("linear");
  return linear(x, weight_, bias_);
}

Tensor Linear::forward(const Tensor& x, DType out_dtype) const {
  RF_PROFILE("linear");
  return linear(x, weight_, bias_, out_dtype);
}

void Linear::init_own(Generator& gen) {
  fill_normal(weight_, init_std_, gen);
  if (bias_.defined()) bias_.zero_();
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, double init_std,
                     int64_t padding_idx)
    : init_std_(init_std), padding_idx_(padding_idx) {
  if (num_embeddings <= 0 || embedding_dim <= 0)
    throw Error(detail::concat("Embedding: sizes must be positive, got ", num_embeddings, " x ",
                               embedding_dim));
  if (padding_idx >= num_embeddings)
    throw Error(detail::concat("Embedding: padding_idx ", padding_idx, " is outside [0, ",
                               num_embeddings, ")"));
  weight_ = register_parameter("weight", Tensor::zeros({num_embeddings, embedding_dim}));
}

Tensor Embedding::forward(const Tensor& ids) const {
  RF_PROFILE("embedding");
  return embedding(weight_, ids);
}

void Embedding::init_own(Generator& gen) {
  fill_normal(weight_, init_std_, gen);
  if (padding_idx_ >= 0) {
    NoGradGuard no_grad;
    Tensor row = weight_.select(0, padding_idx_);
    row.zero_();
  }
}

LayerNorm::LayerNorm(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", Tensor::ones({dim}));
  bias_ = register_parameter("bias", Tensor::zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  RF_PROFILE("layer_norm");
  return layer_norm(x, weight_, bias_, eps_);
}

Tensor LayerNorm::forward(const Tensor& x, const Tensor& residual) const {
  RF_PROFILE("add_layer_norm");
  return add_layer_norm(x, residual, weight_, bias_, eps_);
}

Tensor LayerNorm::forward(const Tensor& x, const Tensor& residual, const Dropout& dropout,
                          bool training, DropoutContext& ctx, const Tensor& tokens) const {
  RF_PROFILE("add_layer_norm");  // with the hidden dropout inside
  return dropout_add_layer_norm(x, residual, weight_, bias_, eps_, dropout.p(), training, ctx,
                                tokens);
}

void LayerNorm::init_own(Generator&) {
  weight_.fill_(1.0);
  bias_.zero_();
}

Tensor Dropout::forward(const Tensor& x, bool training, DropoutContext& ctx,
                        const Tensor& tokens) const {
  if (!training || p_ == 0.0) return x;
  RF_PROFILE("dropout");
  return tokens.defined() ? dropout(x, p_, training, ctx, tokens) : dropout(x, p_, training, ctx);
}

}  // namespace roformer

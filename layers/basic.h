// The generic layers: Linear, Embedding, LayerNorm, Dropout. Each is a thin
// Module over one fused op; parameter names and shapes are PyTorch's.
#pragma once

#include "core/ops.h"
#include "layers/module.h"

namespace roformer {

// y = x W^T + b with weight [out_features, in_features] and bias [out_features].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, double init_std = 0.02);
  Tensor forward(const Tensor& x) const;
  // The result in `out_dtype` (linear()'s rules: bf16 activations under autocast).
  Tensor forward(const Tensor& x, DType out_dtype) const;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias

 protected:
  void init_own(Generator& gen) override;

 private:
  Tensor weight_, bias_;
  double init_std_;
};

// weight[ids] with weight [num_embeddings, embedding_dim]. The padding row (if
// any) starts at zero, as in PyTorch's nn.Embedding(padding_idx=...).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, double init_std = 0.02,
            int64_t padding_idx = -1);
  Tensor forward(const Tensor& ids) const;
  const Tensor& weight() const { return weight_; }

 protected:
  void init_own(Generator& gen) override;

 private:
  Tensor weight_;
  double init_std_;
  int64_t padding_idx_;
};

class Dropout;

// Normalises the last dim, then scales by weight and shifts by bias.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-12);
  Tensor forward(const Tensor& x) const;
  // forward(x + residual), the add fused into the normalisation.
  Tensor forward(const Tensor& x, const Tensor& residual) const;
  // forward(dropout.forward(x, training, ctx, tokens) + residual) bit for bit,
  // the dropout fused into the normalisation too (dropout_add_layer_norm).
  Tensor forward(const Tensor& x, const Tensor& residual, const Dropout& dropout, bool training,
                 DropoutContext& ctx, const Tensor& tokens = Tensor()) const;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 protected:
  void init_own(Generator& gen) override;

 private:
  Tensor weight_, bias_;
  double eps_;
};

// Zeroes with probability p and rescales, only when `training`.
class Dropout : public Module {
 public:
  explicit Dropout(double p) : p_(p) {}
  // tokens: [T, 2] (row, position) of a token-stream x [T, ...] (TokenLayout),
  // undefined for a padded x [B, S, ...].
  Tensor forward(const Tensor& x, bool training, DropoutContext& ctx,
                 const Tensor& tokens = Tensor()) const;
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace roformer

// RoFormer self-attention: Q, K, V projections, RoPE on Q and K per head,
// then softmax attention (one fused op) or RoPE linear attention (paper
// eq. 19). Names follow Hugging Face: attention.self.{query,key,value}.
#pragma once

#include "core/ops.h"
#include "layers/basic.h"
#include "layers/model_config.h"
#include "layers/token_layout.h"

namespace roformer {

// Linear attention with RoPE (paper eq. 19), phi(x) = elu(x) + 1:
//   out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n / sum_n phi(q_m)^T phi(k_n)
// over keys n with key_mask != 0 (all when undefined). The numerator is
// computed as (R_m phi(q_m))^T [sum_n (R_n phi(k_n)) v_n^T], so the cost is
// O(S D Dv), linear in the sequence length. `rotate` = false gives plain
// linear attention (the denominator's form in the numerator too). q, k
// [B, H, S, D], v [B, H, S, Dv], positions [S] -> [B, H, S, Dv].
Tensor rope_linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& key_mask, const Tensor& positions, bool rotate,
                             double rope_base = 10000.0,
                             RopeLayout layout = RopeLayout::interleaved);

class RoFormerSelfAttention : public Module {
 public:
  explicit RoFormerSelfAttention(const ModelConfig& config);
  // hidden [B, S, hidden], key_mask [B, S] (1 = real token) or undefined,
  // positions [S] i64 -> context [B, S, hidden] (before the output dense).
  Tensor forward(const Tensor& hidden, const Tensor& key_mask, const Tensor& positions,
                 bool training, DropoutContext& ctx) const;
  // Token stream: hidden [T, hidden] -> context [T, hidden], each token
  // attending to its own document (softmax attention only). Where RoPE runs
  // inside the attention op (fused_rope, or auto on CUDA) or there is none,
  // and v is not rotated, q, k and v come from one product that the
  // attention op reads in place (stacked_linear, varlen_attention_packed).
  Tensor forward(const Tensor& hidden, const TokenLayout& layout, bool training,
                 DropoutContext& ctx) const;

  const Linear& query() const { return query_; }
  const Linear& key() const { return key_; }
  const Linear& value() const { return value_; }
  // A stage may raise the RoPE base: the rotation tables follow, the
  // parameters stay.
  void set_rope_base(double base) { config_.rope_base = base; }

 private:
  DType projection_dtype(const Tensor& hidden) const;
  // Whether the token-stream forward on `device` takes q, k and v from one product.
  bool packed_projections(Device device) const;

  ModelConfig config_;
  Linear query_, key_, value_;
};

}  // namespace roformer

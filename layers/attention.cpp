#include "layers/attention.h"

#include <cmath>
#include <optional>

#include "core/precision.h"
#include "core/profile.h"

namespace roformer {

namespace {

// RoPE on q and k inside the attention kernel (rope_attention) as
// model.attention_kernel asks; auto: on devices whose kernel rotates tiles as
// it loads them (CUDA), not on the CPU, where the fused op would compose the
// same rope and attention kernels.
bool rope_inside_attention(AttentionKernel kernel, Device device) {
  if (kernel == AttentionKernel::kAuto) return !device.is_cpu();
  return kernel == AttentionKernel::kFusedRope;
}

// Softmax attention of (already rotated) q, k by the kernel the config names.
Tensor softmax_attention(AttentionKernel kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& key_mask, double dropout, bool training, DropoutContext& ctx,
                         double scale) {
  if (kernel == AttentionKernel::kCudnnSdpa)
    return cudnn_attention(q, k, v, key_mask, dropout, training, ctx, scale);
  return attention(q, k, v, key_mask, dropout, training, ctx, scale);
}

}  // namespace

Tensor rope_linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& key_mask, const Tensor& positions, bool rotate,
                             double rope_base, RopeLayout layout) {
  RF_PROFILE("linear_attention");
  if (q.dim() != 4 || k.shape() != q.shape() || v.dim() != 4 || v.shape()[2] != q.shape()[2])
    throw Error(detail::concat("rope_linear_attention: expected q, k [B, H, S, D] and v ",
                               "[B, H, S, Dv], got ", q.desc(), ", ", k.desc(), ", ", v.desc()));
  const Tensor phi_q = elu_plus_one(q);
  Tensor phi_k = elu_plus_one(k);
  if (key_mask.defined()) {
    // Zeroing phi(k_n) removes key n from both sums (R_n 0 = 0).
    const int64_t B = q.size(0), S = q.size(2);
    phi_k = mul(phi_k, key_mask.to(q.dtype()).reshape({B, 1, S, 1}));
  }
  const Tensor rq = rotate ? rope(phi_q, positions, rope_base, layout) : phi_q;
  const Tensor rk = rotate ? rope(phi_k, positions, rope_base, layout) : phi_k;
  const Tensor kv = matmul(rk.transpose(-1, -2), v);                  // [B, H, D, Dv]
  const Tensor numerator = matmul(rq, kv);                            // [B, H, S, Dv]
  const Tensor k_sum = sum(phi_k, {2}, /*keepdim=*/true);             // [B, H, 1, D]
  const Tensor denominator = matmul(phi_q, k_sum.transpose(-1, -2));  // [B, H, S, 1]
  if (!key_mask.defined()) return div(numerator, denominator);        // phi > 0: never 0
  // A sequence with every key masked has 0 / 0: give zeros, as softmax
  // attention does, without a host read (where() picks per element).
  const Tensor one = Tensor::ones({}, denominator.dtype(), denominator.device());
  const Tensor zero = Tensor::zeros({}, denominator.dtype(), denominator.device());
  return where(denominator, div(numerator, where(denominator, denominator, one)), zero);
}

RoFormerSelfAttention::RoFormerSelfAttention(const ModelConfig& config)
    : config_(config),
      query_(config.hidden_size, config.hidden_size, true, config.initializer_range),
      key_(config.hidden_size, config.hidden_size, true, config.initializer_range),
      value_(config.hidden_size, config.hidden_size, true, config.initializer_range) {
  register_module("query", query_);
  register_module("key", key_);
  register_module("value", value_);
}

// Softmax attention reads bf16 projections as they are (bf16 activations
// under autocast); linear attention's sums keep the input's dtype.
DType RoFormerSelfAttention::projection_dtype(const Tensor& hidden) const {
  return config_.attention == AttentionKind::kSoftmax ? activation_dtype(hidden) : hidden.dtype();
}

Tensor RoFormerSelfAttention::forward(const Tensor& hidden, const Tensor& key_mask,
                                      const Tensor& positions, bool training,
                                      DropoutContext& ctx) const {
  const int64_t B = hidden.size(0), S = hidden.size(1);
  const int64_t H = config_.num_attention_heads, Dh = config_.head_dim();
  // [B, S, hidden] -> [B, H, S, Dh] views of the projections (no copies).
  auto heads = [&](const Tensor& x) { return x.view({B, S, H, Dh}).transpose(1, 2); };
  const DType act = projection_dtype(hidden);
  Tensor q = heads(query_.forward(hidden, act));
  Tensor k = heads(key_.forward(hidden, act));
  Tensor v = heads(value_.forward(hidden, act));
  const bool rotate = config_.position == PositionEncoding::kRope;
  const RopeLayout layout = config_.rope_layout;
  Tensor context;
  if (config_.attention == AttentionKind::kLinear) {
    if (rotate && config_.rotary_value) {
      RF_PROFILE("rope");
      v = rope(v, positions, config_.rope_base, layout);
    }
    context =
        rope_linear_attention(q, k, v, key_mask, positions, rotate, config_.rope_base, layout);
  } else {
    const double dropout = config_.attention_probs_dropout_prob,
                 scale = 1.0 / std::sqrt(double(Dh));
    if (rotate && config_.rotary_value) {
      RF_PROFILE("rope");
      v = rope(v, positions, config_.rope_base, layout);
    }
    if (rotate && rope_inside_attention(config_.attention_kernel, hidden.device())) {
      RF_PROFILE("attention");
      context = rope_attention(q, k, v, key_mask, {positions, config_.rope_base, layout}, dropout,
                               training, ctx, scale);
    } else {
      if (rotate) {
        RF_PROFILE("rope");
        q = rope(q, positions, config_.rope_base, layout);
        k = rope(k, positions, config_.rope_base, layout);
      }
      RF_PROFILE("attention");
      context = softmax_attention(config_.attention_kernel, q, k, v, key_mask, dropout, training,
                                  ctx, scale);
    }
  }
  return context.transpose(1, 2).reshape({B, S, H * Dh});
}

Tensor RoFormerSelfAttention::forward(const Tensor& hidden, const TokenLayout& layout,
                                      bool training, DropoutContext& ctx) const {
  if (config_.attention != AttentionKind::kSoftmax)
    throw Error(detail::concat("RoFormerSelfAttention: unpadded batches need model.attention: ",
                               "softmax (set data.unpadded: false for linear attention)"));
  if (config_.attention_kernel == AttentionKernel::kCudnnSdpa)
    throw Error(detail::concat("RoFormerSelfAttention: model.attention_kernel: cudnn_sdpa takes ",
                               "padded batches only, not token streams (set data.unpadded: false ",
                               "or choose another model.attention_kernel)"));
  const int64_t T = hidden.size(0);
  const int64_t H = config_.num_attention_heads, Dh = config_.head_dim();
  const DType act = projection_dtype(hidden);
  const bool rotary = config_.position == PositionEncoding::kRope;
  const double dropout = config_.attention_probs_dropout_prob, scale = 1.0 / std::sqrt(double(Dh));
  if (packed_projections(hidden.device())) {
    // q, k and v from one product [T, 3 * hidden], read in place by the
    // attention op, which writes their gradients in place too.
    Tensor qkv;
    {
      RF_PROFILE("linear");
      qkv = stacked_linear(hidden, {query_.weight(), key_.weight(), value_.weight()},
                           {query_.bias(), key_.bias(), value_.bias()}, act);
    }
    RF_PROFILE("attention");
    std::optional<RotaryEmbedding> rope;
    if (rotary) rope = RotaryEmbedding{layout.positions, config_.rope_base, config_.rope_layout};
    return varlen_attention_packed(qkv, H, layout.segments, rope, dropout, training, ctx, scale,
                                   layout.device_segments)
        .view({T, H * Dh});
  }
  // [T, hidden] -> [T, H, Dh] views of the projections (no copies).
  Tensor q = query_.forward(hidden, act).view({T, H, Dh});
  Tensor k = key_.forward(hidden, act).view({T, H, Dh});
  Tensor v = value_.forward(hidden, act).view({T, H, Dh});
  const bool inside = rotary && rope_inside_attention(config_.attention_kernel, hidden.device());
  if (rotary) {
    RF_PROFILE("rope");
    // rope() rotates x [..., S, D] at positions [S]: the stream seen as [H, T, Dh].
    auto rotate = [&](const Tensor& x) {
      return rope(x.transpose(0, 1), layout.positions, config_.rope_base, config_.rope_layout)
          .transpose(0, 1);
    };
    if (!inside) {
      q = rotate(q);
      k = rotate(k);
    }
    if (config_.rotary_value) v = rotate(v);
  }
  RF_PROFILE("attention");
  const Tensor context =
      inside ? varlen_rope_attention(q, k, v, layout.segments,
                                     {layout.positions, config_.rope_base, config_.rope_layout},
                                     dropout, training, ctx, scale, layout.device_segments)
             : varlen_attention(q, k, v, layout.segments, dropout, training, ctx, scale,
                                layout.device_segments);
  return context.view({T, H * Dh});
}

bool RoFormerSelfAttention::packed_projections(Device device) const {
  // Where RoPE runs inside the attention op (model.attention_kernel, or auto
  // on CUDA) or there is none: the packed op rotates inside. Not when v is
  // rotated too (a rope op between its projection and attention). On the
  // CPU auto keeps the separate rope ops: there the op inside composes the
  // same kernels with f32 gradient scratch, measured 4x slower in backward.
  const AttentionKernel kernel = config_.attention_kernel;
  const bool rotary = config_.position == PositionEncoding::kRope;
  const bool attention_op =
      kernel == AttentionKernel::kAuto || kernel == AttentionKernel::kFusedRope;
  const bool biases = query_.bias().defined() == key_.bias().defined() &&
                      key_.bias().defined() == value_.bias().defined();
  return attention_op && biases && !config_.rotary_value &&
         (!rotary || rope_inside_attention(kernel, device));
}

}  // namespace roformer

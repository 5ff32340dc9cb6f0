// The differentiable ops. Each is one autograd node with a hand-written
// backward; forward and backward live side by side in core/ops/<family>.cpp
// and reach their kernels (core/kernels/kernel_list.h; CPU ones in core/cpu/)
// through launch:: in core/ops/dispatch.h. Shapes broadcast as in NumPy where
// noted.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/dropout_context.h"
#include "core/rope_layout.h"
#include "core/tensor.h"

namespace roformer {

// --- elementwise, broadcasting (core/ops/binary.cpp) -------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);   // a - s
Tensor rsub(const Tensor& a, double s);  // s - a
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);  // a / s

// --- elementwise unary (core/ops/unary.cpp) ------------------------------------
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor gelu(const Tensor& a);          // erf form, oneDNN eltwise_gelu_erf
Tensor elu_plus_one(const Tensor& a);  // elu(x) + 1: linear attention's feature map

// --- reductions (core/ops/reduce.cpp) ------------------------------------------
Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepdim = false);
Tensor sum(const Tensor& a);  // all elements
Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepdim = false);
Tensor mean(const Tensor& a);
// Maximum along dim: (values, indices as i64). Gradient flows to the argmax.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
// Sums `a` down to `shape` (the inverse of broadcasting), as broadcasting ops'
// backward needs.
Tensor sum_to(const Tensor& a, const Shape& shape);

// --- matrix products on oneDNN (core/ops/matmul.cpp) ---------------------------
// [..., M, K] x [..., K, N] with broadcast batch dims; transposed views are
// passed to oneDNN as strides, never copied.
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] * weight[out, in]^T + bias[out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// The same with the result in `out_dtype`: x's dtype, or under bf16 autocast
// (f32 weights) f32 or bf16 for an f32 or bf16 x (bf16 activations,
// core/precision.h). Each gradient comes in its input's dtype.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType out_dtype);
// Several linears of one input as one product: linear(x, concat(weights, 0),
// concat(biases, 0), out_dtype), the results side by side in the last
// dimension (a layer's query, key and value projections). biases: one per
// weight, all defined or all undefined. Each parameter's gradient is its
// slice of the one weight-gradient product; x's gradient is one product.
Tensor stacked_linear(const Tensor& x, const std::vector<Tensor>& weights,
                      const std::vector<Tensor>& biases, DType out_dtype);
// The feed-forward block with the tanh GELU (Hugging Face's "gelu_new"):
// linear(gelu_tanh(linear(x, w1, b1)), w2, b2), gelu_tanh(u) = u/2 (1 +
// tanh(sqrt(2/pi) (u + 0.044715 u^3))). On CUDA the GELU and its gradient
// (with b1's) run in cuBLASLt's GEMM epilogues; not the erf GELU of gelu().
Tensor gelu_tanh_ffn(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                     const Tensor& b2);
// The same with the result in `out_dtype` (linear()'s rules); a bf16 result
// under autocast keeps the inner activations in bf16 too.
Tensor gelu_tanh_ffn(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                     const Tensor& b2, DType out_dtype);
// Process-wide: whether a linear's bias gradient is summed inside its
// weight-gradient product where the device can (CUDA: cuBLASLt's BGRADB
// epilogue), rather than by a pass of its own. Off: on an H100 (cuBLASLt 13)
// the epilogue refuses the bf16 sums the model asks for, so the product and
// the sums run apart anyway (mlm_step_bench --precision bf16-bgrad measures
// it; docs/performance/gpu-step-changes.md).
void set_bias_grad_in_product(bool on);
bool bias_grad_in_product();

// --- normalisation and probabilities (core/ops/softmax.cpp, layer_norm.cpp) ---
Tensor softmax(const Tensor& x);      // over the last dim
Tensor log_softmax(const Tensor& x);  // over the last dim
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// layer_norm(x + residual) (same shape and dtype, or a bf16 x on an f32
// residual: the sum, y and the parameters f32), the add fused into the kernel.
Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                      const Tensor& bias, double eps);
// add_layer_norm(dropout(x, p, training, ctx[, tokens]), residual, ...) bit for
// bit (the same site and draws), with the dropout inside the layer-norm
// kernels: applied where they read x, and to x's gradient where they write
// it, so a transformer's residual block ends in one pass each way rather
// than two. x is [T, features] with tokens, else [B, S, features] or
// [B, features]; other shapes run the pair.
Tensor dropout_add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              const Tensor& bias, double eps, double p, bool training,
                              DropoutContext& ctx, const Tensor& tokens = Tensor());
// Process-wide, on by default: whether dropout_add_layer_norm fuses (off runs
// dropout, then add_layer_norm: the A/B of mlm_step_bench --precision
// bf16-unfuseddrop; the results are the same bits either way).
void set_fused_residual_dropout(bool on);
bool fused_residual_dropout();
// FusedResidualDropoutScope (below) sets it for a scope.

// --- training-specific (core/ops/*.cpp) -----------------------------------------
// Zeroes each element with probability p and scales the rest by 1/(1-p).
// x is [B, S, ...] (or [B, F]); row b is sequence ctx.first_sequence + b of
// the global batch, and each element's draw follows the shared rule of
// core/philox.h for the context's next site. Identity (no site taken) when
// !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, DropoutContext& ctx);
// The same on a token stream (unpadded batch): x [T, features], tokens [T, 2]
// i64 of (row, position): token t draws what element (row, position) of a
// padded [B, S, features] input would.
Tensor dropout(const Tensor& x, double p, bool training, DropoutContext& ctx, const Tensor& tokens);
// weight[ids]: ids (i32/i64) of any shape -> [..., dim]. Backward scatter-adds
// rows in a fixed order (deterministic). An id out of range is raised at the
// next sync point (see check_kernel_errors), naming the id and its position.
Tensor embedding(const Tensor& weight, const Tensor& ids);
// Mean negative log-likelihood of targets under softmax(logits) over rows whose
// target != ignore_index. logits [N, C], targets [N] (i32/i64). Log-softmax is
// fused: only the row statistics are kept for backward. The loss is f32 for
// f32/bf16 logits, f64 for f64; a bad target is raised at the next sync point.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// The same loss with what a caller normalises and scores it by, as i64 []
// tensors on the logits' device (no host read): `count`, the rows it
// averages over (targets != ignore_index), and `correct`, those of them whose
// argmax logit is the target (argmax's rule: the first NaN, else the first
// largest). Both come out of the loss's one pass over the logits.
struct CrossEntropyOutputs {
  Tensor loss, count, correct;
};
CrossEntropyOutputs cross_entropy_with_counts(const Tensor& logits, const Tensor& targets,
                                              int64_t ignore_index = -100);

// Rotary position embedding (paper eq. 34) of x [..., S, D] at positions [S]
// (i32/i64): pairs (x[2i], x[2i+1]) (interleaved) or (x[i], x[i+D/2]) (half)
// rotated by m * base^(-2i/D). D must be even.
Tensor rope(const Tensor& x, const Tensor& positions, double base = 10000.0,
            RopeLayout layout = RopeLayout::interleaved);

// Softmax attention as one node (core/ops/attention.cpp): per (batch, head)
// softmax(q k^T * scale, keys with key_padding_mask == 0 excluded), dropout p
// on the probabilities when training (the shared Philox rule of core/philox.h
// at the context's next site: batch row b is sequence ctx.first_sequence + b,
// the query is the position, the key the feature), times v. q [B, H, Sq, D], k [B, H, Sk, D], v [B,
// H, Sk, Dv] (strided views are fine), key_padding_mask [B, Sk] (nonzero = keep) or undefined.
// Returns [B, H, Sq, Dv] laid out as [B, Sq, H, Dv] in memory, so out.transpose(1, 2).reshape({B,
// Sq, H * Dv}) is a free view. Backward keeps only the row log-sum-exp (and dropout keep bits) and
// recomputes the probabilities. f32 (oneDNN) and f64 (loops); bf16 q, k, v (bf16 activations)
// give a bf16 output and bf16 gradients, the f32 arithmetic rounded once.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                 double dropout_p, bool training, DropoutContext& ctx, double scale);
// attention() by the device vendor's fused kernel where it takes the call:
// cuDNN SDPA on a CUDA device for bf16 operands (bf16 autocast), head dim a
// multiple of 8 up to 128 and no dropout while training
// (model.attention_kernel: cudnn_sdpa; the config makes training meet these).
// Its key masks must keep a prefix of each row (padded batches; a row that
// does not is reported at the next sync). Anywhere else the device's own
// kernels compute the same function, as attention() does.
Tensor cudnn_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& key_padding_mask, double dropout_p, bool training,
                       DropoutContext& ctx, double scale);
// Variable-length softmax attention on a token stream (core/ops/attention.cpp):
// q, k [T, H, D], v [T, H, Dv] (strided views fine); segments [N, 4] i64 of
// (first token, length, row, position of the first token in its row), in
// increasing, non-overlapping token order. Each token attends only to the
// tokens of its own segment (a sequence, or one document of a packed row);
// tokens in no segment get zeros. Dropout draws follow the padded op's rule
// with sequence ctx.first_sequence + row and the row position as the query
// position, so an unpadded sequence draws the masks its padded row would.
// The table is checked on the host: keep it there, as TokenLayout does (a
// table on q's device is read back, a wait for the device). The kernels read
// it on q's device: `segments_on_device`, the same table already there (as
// TokenLayout uploads it once per micro-batch), or else a copy made here.
// Returns [T, H, Dv] contiguous. f32 and f64 (loops); bf16 as attention().
Tensor varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segments,
                        double dropout_p, bool training, DropoutContext& ctx, double scale,
                        const Tensor& segments_on_device = Tensor());

// Attention with RoPE inside (core/ops/attention.cpp): what attention() and
// varlen_attention() give for rope(q) and rope(k) at `positions` -- padded
// q, k [B, H, S, D] with positions [S], or a token stream q, k [T, H, D] with
// positions [T] -- as one node whose gradients are those of the unrotated q
// and k. A device may rotate inside its kernel (CUDA does for bf16 at head
// dim 64), so no rotated copy of q or k is kept; the CPU composes the rope
// and attention kernels.
struct RotaryEmbedding {
  Tensor positions;  // i32/i64
  double base = 10000.0;
  RopeLayout layout = RopeLayout::interleaved;
};
Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& key_padding_mask, const RotaryEmbedding& rotary,
                      double dropout_p, bool training, DropoutContext& ctx, double scale);
Tensor varlen_rope_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& segments, const RotaryEmbedding& rotary,
                             double dropout_p, bool training, DropoutContext& ctx, double scale,
                             const Tensor& segments_on_device = Tensor());
// varlen_attention (rotary undefined) or varlen_rope_attention of q, k and v
// packed side by side: qkv [T, 3 * heads * D], as stacked_linear writes a
// layer's query, key and value projections in one product. The same result
// [T, heads, D]; qkv gets one gradient, whose three parts the kernels write
// in place (three separate gradients would need a copy each into it).
Tensor varlen_attention_packed(const Tensor& qkv, int64_t heads, const Tensor& segments,
                               const std::optional<RotaryEmbedding>& rotary, double dropout_p,
                               bool training, DropoutContext& ctx, double scale,
                               const Tensor& segments_on_device = Tensor());
// Process-wide: whether the token-stream ops with RoPE inside
// (varlen_rope_attention, varlen_attention_packed) rotate q and k once, into
// rotated copies by the rope kernel, then run the plain attention forward,
// and back the rope_attention kernel on the copies (RopeInputs::rotated),
// which rotates dq and dk back as it writes them (copies kept for
// backward: 2 x [T, H, D]); rather than rotating inside the attention
// kernels, where on CUDA every block of queries rotates every key tile
// again. On by default: an H200 (2026-11-27) ran RoFormer-base's training
// step 1.09x faster at seq 1536 rotated once, and 1.04x at 512, for 9% more
// peak memory (mlm_step_bench --precision bf16-ropeinside times RoPE
// inside). On the CPU, RoPE inside is the same composition of kernels with
// scratch copies. The same function either way, up to rounding; dq and dk
// are rounded to their dtype once either way.
void set_rotate_once(bool on);
bool rotate_once();

// A process-wide switch set for a scope; the setting before it comes back at
// its end.
template <bool (*Get)(), void (*Set)(bool)>
class SwitchScope {
 public:
  explicit SwitchScope(bool on) : previous_(Get()) { Set(on); }
  ~SwitchScope() { Set(previous_); }
  SwitchScope(const SwitchScope&) = delete;
  SwitchScope& operator=(const SwitchScope&) = delete;

 private:
  bool previous_;
};
// set_rotate_once and set_fused_residual_dropout for a scope.
using RotateOnceScope = SwitchScope<rotate_once, set_rotate_once>;
using FusedResidualDropoutScope = SwitchScope<fused_residual_dropout, set_fused_residual_dropout>;

// --- structure (core/ops/structure.cpp) -----------------------------------------
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// cond ? a : b with broadcasting; cond is any dtype (nonzero = true).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor cast(const Tensor& x, DType dtype);
// Rows of x [N, ...] at indices [M] (i32/i64) -> [M, ...]; backward
// scatter-adds. A bad index is raised at the next sync point.
Tensor index_select(const Tensor& x, const Tensor& indices);

// --- operators ------------------------------------------------------------------
inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator+(const Tensor& a, double s) {
  return add(a, s);
}
inline Tensor operator-(const Tensor& a, double s) {
  return sub(a, s);
}
inline Tensor operator*(const Tensor& a, double s) {
  return mul(a, s);
}
inline Tensor operator/(const Tensor& a, double s) {
  return div(a, s);
}
inline Tensor operator*(double s, const Tensor& a) {
  return mul(a, s);
}
inline Tensor operator-(const Tensor& a) {
  return neg(a);
}

// Broadcast shape of a and b; throws naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Throws unless every defined tensor lives on one device whose kernels this
// build has; returns that device.
Device kernel_device(const char* op, std::initializer_list<const Tensor*> tensors);
Device kernel_device(const char* op, const std::vector<const Tensor*>& tensors);

// Kernels that check indices (embedding ids, cross-entropy targets,
// index_select) do not stop the op: they report the first bad index to their
// device, and this raises it -- naming the op, the bad id, its position and
// the valid range -- at the one synchronisation point. Tensor::item() and
// to_vector() call it; a trainer may call it once per step.
void check_kernel_errors();

}  // namespace roformer

// Fused softmax attention kernels: softmax(q k^T * scale + key mask) v with
// dropout on the probabilities, per (batch, head). Nothing S x S is kept
// between forward and backward: forward saves the row log-sum-exp (and the
// dropout keep bits), backward recomputes the probabilities from q and k.
// f32 runs one OpenMP region over (batch, head) with single-threaded oneDNN
// products per head, so results do not depend on the thread count and the
// only S x S memory is one (forward) or two (backward) buffers per thread.
#pragma once

#include <cstdint>

#include "core/dropout_context.h"
#include "core/tensor.h"

namespace roformer::cpu {

struct AttentionArgs {
  Tensor q, k, v;  // [B, H, Sq, D], [B, H, Sk, D], [B, H, Sk, Dv]; unit stride in the last dim
  // [B * Sk] keep flags (1 = attend), or null for no mask. The rows of a
  // batch element with no key kept get zero output and zero gradient.
  const uint8_t* key_keep = nullptr;
  double scale = 1.0;
  // Dropout on the probabilities: keep bits are drawn in forward by the
  // shared rule of core/philox.h at this site and read back in backward.
  double dropout_p = 0.0;
  DropoutKey dropout;
};

// out [B, H, Sq, Dv] (any strides, unit last), lse [B, H, Sq] contiguous (the
// row log-sum-exp of the masked, scaled scores), keep_bits [B, H, Sq,
// ceil(Sk / 32)] i32 contiguous when dropout_p > 0 (else undefined).
void attention_forward(const AttentionArgs& args, const Tensor& out, const Tensor& lse,
                       const Tensor& keep_bits);

// Gradients of the inputs given grad_out (same geometry rules as out).
// grad_q/grad_k/grad_v are written (not accumulated).
void attention_backward(const AttentionArgs& args, const Tensor& out, const Tensor& lse,
                        const Tensor& keep_bits, const Tensor& grad_out, const Tensor& grad_q,
                        const Tensor& grad_k, const Tensor& grad_v);

// Number of 32-bit words per row of keep bits for Sk keys.
inline int64_t keep_words(int64_t sk) {
  return (sk + 31) / 32;
}

}  // namespace roformer::cpu

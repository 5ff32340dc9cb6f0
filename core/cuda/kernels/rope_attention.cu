// Attention with RoPE inside on CUDA: the tensor-core kernel rotates Q and K
// tiles as it loads them (flash_attention.cu), or takes them rotated
// (RopeInputs::rotated), and rotates the gradients back as it writes them,
// when it takes the operands (bf16, head dim 64); otherwise the rope and
// attention kernels composed, as on the CPU
// (core/kernels/rope_attention_composite.h).
#include <memory>

#include "core/cuda/kernels/common.cuh"
#include "core/cuda/kernels/flash_attention.h"
#include "core/kernels/rope_attention_composite.h"

namespace roformer::kernels::cuda {

namespace {

// Scratch on the call's stream, owned for the call.
struct StreamScratch {
  std::unique_ptr<Scratch> memory;
  void* get() const { return memory->as<void>(); }
};

// The tensor-core kernel takes the call: bf16 operands it supports, and an
// f32 table on a 16-byte boundary (its angles travel by 16-byte cp.async);
// anything else composes the rope and attention kernels.
bool fused(const KernelTensor& table, const KernelTensor& q, const KernelTensor& k,
           const KernelTensor& v) {
  return table.dtype == DType::f32 && reinterpret_cast<uintptr_t>(table.data) % 16 == 0 &&
         flash_supported(q, k, v);
}

// The fused kernel's rotation argument.
FlashRope rope_of(const KernelTensor& table, bool interleaved,
                  RopeInputs inputs = RopeInputs::unrotated) {
  return FlashRope{&table, interleaved, inputs == RopeInputs::rotated};
}

}  // namespace

void rope_attention_forward(Stream stream, const AttentionParams& params, const KernelTensor& table,
                            bool interleaved, const KernelTensor& q, const KernelTensor& k,
                            const KernelTensor& v, const KernelTensor& mask_or_segments,
                            const KernelTensor& out, const KernelTensor& lse,
                            const KernelTensor& keep_bits) {
  check_attention_forward_dtypes("rope_attention kernel", q, k, v, out, lse);
  if (fused(table, q, k, v)) {
    const bool token_stream = q.ndim == 3;
    flash_forward(stream, params, rope_of(table, interleaved), q, k, v,
                  token_stream ? KernelTensor{} : mask_or_segments,
                  token_stream ? mask_or_segments : KernelTensor{}, out, lse, keep_bits);
    return;
  }
  auto alloc = [&](size_t bytes) {
    return StreamScratch{std::make_unique<Scratch>(stream, bytes > 0 ? bytes : 1)};
  };
  rope_composite::forward(cuda_kernel_table, stream, alloc, params, table, interleaved, q, k, v,
                          mask_or_segments, out, lse, keep_bits);
}

void rope_attention_backward(Stream stream, const AttentionParams& params,
                             const KernelTensor& table, bool interleaved, RopeInputs inputs,
                             const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                             const KernelTensor& mask_or_segments, const KernelTensor& out,
                             const KernelTensor& lse, const KernelTensor& keep_bits,
                             const KernelTensor& grad_out, const KernelTensor& grad_q,
                             const KernelTensor& grad_k, const KernelTensor& grad_v) {
  check_attention_backward_dtypes("rope_attention kernel", q, k, v, out, lse, grad_out, grad_q,
                                  grad_k, grad_v);
  if (fused(table, q, k, v) && flash_supported(q, k, v, grad_out)) {
    const bool token_stream = q.ndim == 3;
    flash_backward(stream, params, rope_of(table, interleaved, inputs), q, k, v,
                   token_stream ? KernelTensor{} : mask_or_segments,
                   token_stream ? mask_or_segments : KernelTensor{}, out, lse, keep_bits, grad_out,
                   grad_q, grad_k, grad_v);
    return;
  }
  auto alloc = [&](size_t bytes) {
    return StreamScratch{std::make_unique<Scratch>(stream, bytes > 0 ? bytes : 1)};
  };
  rope_composite::backward(cuda_kernel_table, stream, alloc, params, table, interleaved, inputs, q,
                           k, v, mask_or_segments, out, lse, keep_bits, grad_out, grad_q, grad_k,
                           grad_v);
}

}  // namespace roformer::kernels::cuda

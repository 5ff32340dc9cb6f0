// The token-stream kernels (unpadded batches, docs/architecture.md "Token
// stream"). Variable-length attention runs on the tensor-core kernel
// (flash_attention.cu: bf16 q, k, v at head dim 64, segments on the device);
// other operands, and token-stream dropout, are CPU-only so far and refuse
// with an error naming the kernel.
#include "core/cuda/kernels/common.cuh"
#include "core/cuda/kernels/flash_attention.h"

namespace roformer::kernels::cuda {

namespace {

[[noreturn]] void not_on_cuda(const char* kernel, const char* what) {
  throw Error(detail::concat(kernel, ": not on CUDA yet for ", what,
                             " (unpadded batches run on the CPU only; set data.unpadded: false "
                             "for a CUDA run)"));
}

void check_varlen(const char* kernel, const KernelTensor& q, const KernelTensor& k,
                  const KernelTensor& v) {
  if (!flash_supported(q, k, v))
    not_on_cuda(kernel, "operands other than bf16 q, k, v at head dim 64");
}

}  // namespace

void dropout_tokens(Stream, const KernelTensor&, const KernelTensor&, const KernelTensor&, double,
                    const DropoutKey&) {
  not_on_cuda("dropout_tokens", "token-stream dropout");
}

void attention_varlen_forward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                              const KernelTensor& k, const KernelTensor& v,
                              const KernelTensor& segments, const KernelTensor& out,
                              const KernelTensor& lse, const KernelTensor& keep_bits) {
  check_varlen("attention_varlen_forward", q, k, v);
  flash_forward(stream, params, FlashRope{}, q, k, v, KernelTensor{}, segments, out, lse,
                keep_bits);
}

void attention_varlen_backward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                               const KernelTensor& k, const KernelTensor& v,
                               const KernelTensor& segments, const KernelTensor& out,
                               const KernelTensor& lse, const KernelTensor& keep_bits,
                               const KernelTensor& grad_out, const KernelTensor& grad_q,
                               const KernelTensor& grad_k, const KernelTensor& grad_v) {
  check_varlen("attention_varlen_backward", q, k, v);
  if (!flash_supported(q, k, v, grad_out))
    not_on_cuda("attention_varlen_backward", "a grad_out other than bf16 rows");
  flash_backward(stream, params, FlashRope{}, q, k, v, KernelTensor{}, segments, out, lse,
                 keep_bits, grad_out, grad_q, grad_k, grad_v);
}

}  // namespace roformer::kernels::cuda

// The token-stream kernels (unpadded batches, docs/architecture.md "Token
// stream") are CPU-only so far: the CUDA entries exist so the table links,
// and refuse with an error naming the kernel. Their layout (q, k, v [T, H, D],
// segments [N, 4] of (first token, length, row, row position), keep bits
// [T, H, W]) is the one a varlen flash kernel would take.
#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

[[noreturn]] void not_on_cuda(const char* kernel) {
  throw Error(detail::concat(kernel,
                             ": not on CUDA yet (unpadded batches run on the CPU only; set "
                             "data.unpadded: false for a CUDA run)"));
}

}  // namespace

void dropout_tokens(Stream, const KernelTensor&, const KernelTensor&, const KernelTensor&, double,
                    const DropoutKey&) {
  not_on_cuda("dropout_tokens");
}

void attention_varlen_forward(Stream, const AttentionParams&, const KernelTensor&,
                              const KernelTensor&, const KernelTensor&, const KernelTensor&,
                              const KernelTensor&, const KernelTensor&, const KernelTensor&) {
  not_on_cuda("attention_varlen_forward");
}

void attention_varlen_backward(Stream, const AttentionParams&, const KernelTensor&,
                               const KernelTensor&, const KernelTensor&, const KernelTensor&,
                               const KernelTensor&, const KernelTensor&, const KernelTensor&,
                               const KernelTensor&, const KernelTensor&, const KernelTensor&,
                               const KernelTensor&) {
  not_on_cuda("attention_varlen_backward");
}

}  // namespace roformer::kernels::cuda

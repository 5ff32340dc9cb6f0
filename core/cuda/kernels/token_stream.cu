// The token-stream kernels (unpadded batches, docs/architecture.md "Token
// stream"): dropout keyed by each token's (row, position), and
// variable-length attention on the tensor-core kernel (flash_attention.cu:
// bf16 q, k, v at head dim 64, segments on the device); other attention
// operands are CPU-only so far and refuse with an error naming the kernel.
#include "core/cuda/kernels/common.cuh"
#include "core/cuda/kernels/flash_attention.h"
#include "core/philox.h"

namespace roformer::kernels::cuda {

namespace {

[[noreturn]] void not_on_cuda(const char* kernel, const char* what) {
  throw Error(detail::concat(kernel, ": not on CUDA yet for ", what,
                             " (unpadded batches run on the CPU only; set data.unpadded: false "
                             "for a CUDA run)"));
}

// Element (t, f) is feature f of token t = (row, position): the draw the
// padded dropout kernel makes for that row and position.
template <class T>
__global__ void dropout_tokens_kernel(const T* x, T* out, int64_t n, int64_t features,
                                      const int64_t* tokens, int64_t s0, int64_t s1, PhiloxKey pkey,
                                      DropoutKey key, uint32_t threshold, acc_t<T> scale) {
  using A = acc_t<T>;
  RF_GRID_LOOP(i, n) {
    const int64_t f = i % features, t = i / features;
    const int64_t row = tokens[t * s0], position = tokens[t * s0 + s1];
    const uint32_t bits = dropout_word(pkey, uint32_t(f), uint32_t(position),
                                       uint32_t(key.first_sequence + row), key.site, 0);
    out[i] = (bits >> 8) >= threshold ? convert<T>(convert<A>(x[i]) * scale) : convert<T>(0.0f);
  }
}

void check_varlen(const char* kernel, const KernelTensor& q, const KernelTensor& k,
                  const KernelTensor& v) {
  if (!flash_supported(q, k, v))
    not_on_cuda(kernel, "operands other than bf16 q, k, v at head dim 64");
}

}  // namespace

void dropout_tokens(Stream stream, const KernelTensor& x, const KernelTensor& out,
                    const KernelTensor& tokens, double p, const DropoutKey& key) {
  RF_CHECK(x.ndim == 2 && x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel() &&
               tokens.ndim == 2 && tokens.sizes[0] == x.sizes[0] && tokens.sizes[1] == 2 &&
               tokens.dtype == DType::i64,
           "dropout_tokens kernel: expected contiguous x and out [T, features] and tokens [T, 2] "
           "i64");
  const int64_t n = x.numel();
  if (n == 0) return;
  on_floating_dtype(x.dtype, "dropout", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    RF_LAUNCH((dropout_tokens_kernel<T>), grid_for(n), kThreads, 0, native(stream), x.as<const T>(),
              out.as<T>(), n, x.sizes[1], tokens.as<const int64_t>(), tokens.strides[0],
              tokens.strides[1], dropout_key(key.seed, key.step), key, dropout_threshold(p),
              A(1.0 / (1.0 - p)));
  });
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

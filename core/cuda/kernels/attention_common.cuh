// What the CUDA attention kernels share (attention.cu: the simple f32/f64
// kernel; flash_attention.cu: the bf16 tensor-core kernel): the dropout rule
// of core/philox.h as launch arguments, and the key mask read in any dtype.
#pragma once

#include <memory>

#include "core/cuda/kernels/common.cuh"
#include "core/kernels/attention_dtypes.h"
#include "core/philox.h"

namespace roformer::kernels::cuda {

// Keep bit of key j for query i of batch row b, head h: the shared rule's
// draw for (sequence first + b, position i, feature j, head h).
struct DropoutRule {
  bool on = false;
  PhiloxKey key{};
  int64_t first_sequence = 0;
  int64_t first_position = 0;  // position of query row 0 (a token-stream segment's)
  uint32_t site = 0;
  uint32_t threshold = 0;
  double inv_keep = 1.0;
};

inline DropoutRule dropout_rule(const AttentionParams& params) {
  DropoutRule r;
  r.on = params.dropout_p > 0.0;
  r.key = dropout_key(params.dropout.seed, params.dropout.step);
  r.first_sequence = params.dropout.first_sequence;
  r.site = params.dropout.site;
  r.threshold = dropout_threshold(params.dropout_p);
  r.inv_keep = r.on ? 1.0 / (1.0 - params.dropout_p) : 1.0;
  return r;
}

// Whether key j of batch row b is attended to (mask [B, Sk], nonzero = keep;
// undefined: every key).
__device__ __forceinline__ bool key_kept(const KernelTensor& mask, int64_t b, int64_t j) {
  if (!mask.defined()) return true;
  const int64_t off = b * mask.strides[0] + j * mask.strides[1];
  switch (mask.dtype) {
    case DType::f32:
      return mask.as<const float>()[off] != 0.0f;
    case DType::f64:
      return mask.as<const double>()[off] != 0.0;
    case DType::bf16:
      return __bfloat162float(mask.as<const bf16_t>()[off]) != 0.0f;
    case DType::i32:
      return mask.as<const int32_t>()[off] != 0;
    case DType::i64:
      return mask.as<const int64_t>()[off] != 0;
  }
  return true;
}

// Sets a kernel's dynamic shared memory limit when it needs more than 48 KB.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    RF_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    // All of L1 as shared memory where it is asked for: two blocks of the
    // flash kernels an SM need up to 226.5 of its 228 KB.
    RF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       int(cudaSharedmemCarveoutMaxShared)));
  }
}

// bf16 operands with f32 outputs (autocast) outside the tensor-core kernel's
// reach (head dim other than 64): the simple kernel runs in f32 on exact f32
// copies of the bf16 values.
struct F32Copy {
  std::unique_ptr<Scratch> memory;
  KernelTensor tensor;
  F32Copy(Stream stream, const KernelTensor& t) {
    if (!t.defined()) return;
    memory = std::make_unique<Scratch>(stream, size_t(t.numel() > 0 ? t.numel() : 1) * 4);
    tensor = contiguous_like(t, memory->as<void>(), DType::f32);
    copy(stream, t, tensor);
  }
};

inline bool upcast(const KernelTensor& q, const KernelTensor& out) {
  return q.dtype == DType::bf16 && out.dtype == DType::f32;
}

// The simple kernels of attention.cu (any floating dtype and head dim; q, k,
// v [B, H, S, D] with unit last stride, lse [B, H, Sq] and keep bits
// [B, H, Sq, ceil(Sk / 32)] contiguous) with an explicit dropout rule: the
// token-stream fallback runs them per segment with the segment's sequence
// and first position.
void simple_attention_forward(Stream stream, double scale, const DropoutRule& drop,
                              const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                              const KernelTensor& key_mask, const KernelTensor& out,
                              const KernelTensor& lse, const KernelTensor& keep_bits);
void simple_attention_backward(Stream stream, double scale, const DropoutRule& drop,
                               const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                               const KernelTensor& key_mask, const KernelTensor& out,
                               const KernelTensor& lse, const KernelTensor& keep_bits,
                               const KernelTensor& grad_out, const KernelTensor& grad_q,
                               const KernelTensor& grad_k, const KernelTensor& grad_v);

}  // namespace roformer::kernels::cuda

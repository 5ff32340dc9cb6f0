// The dtypes the attention kernels take (attention_*, attention_varlen_* and
// rope_attention_* in core/kernels/kernel_list.h), checked alike by the CPU's
// padded and token-stream kernels and by the RoPE-inside composition
// (core/kernels/rope_attention_composite.h, also CUDA's fallback). C++17, no
// host-only types: nvcc reads this header.
#pragma once

#include "core/error.h"
#include "core/kernels/kernel_tensor.h"

namespace roformer::kernels {

// The dtype the kernels compute in for q's dtype: f64 for f64, else f32.
inline DType attention_accumulator(DType q) {
  return q == DType::f64 ? DType::f64 : DType::f32;
}

// An output of the attention (out, or the gradients of q, k, v): the
// accumulation dtype, or bf16 too when q is bf16 (the f32 result rounded once).
inline bool attention_output_dtype(DType q, DType out) {
  return out == attention_accumulator(q) || (q == DType::bf16 && out == DType::bf16);
}

// Throws naming every dtype unless q, k, v share one floating dtype, out is
// an output dtype for it and lse is its accumulation dtype.
inline void check_attention_forward_dtypes(const char* kernel, const KernelTensor& q,
                                           const KernelTensor& k, const KernelTensor& v,
                                           const KernelTensor& out, const KernelTensor& lse) {
  const bool floating = q.dtype == DType::f32 || q.dtype == DType::bf16 || q.dtype == DType::f64;
  RF_CHECK(
      floating && k.dtype == q.dtype && v.dtype == q.dtype &&
          attention_output_dtype(q.dtype, out.dtype) && lse.dtype == attention_accumulator(q.dtype),
      kernel, ": unsupported dtypes (q ", dtype_name(q.dtype), ", k ", dtype_name(k.dtype), ", v ",
      dtype_name(v.dtype), ", out ", dtype_name(out.dtype), ", lse ", dtype_name(lse.dtype),
      "): expected q, k, v of one dtype; out and lse f32 for f32 (f64 for f64); "
      "out f32 or bf16 and lse f32 for bf16");
}

// The forward's rule for q, k, v, out and lse; grad_out in q's dtype; the
// three gradients of one output dtype, bf16 ones only with a bf16 out (the
// kernels that compute in q's dtype read out in it too).
inline void check_attention_backward_dtypes(const char* kernel, const KernelTensor& q,
                                            const KernelTensor& k, const KernelTensor& v,
                                            const KernelTensor& out, const KernelTensor& lse,
                                            const KernelTensor& grad_out,
                                            const KernelTensor& grad_q, const KernelTensor& grad_k,
                                            const KernelTensor& grad_v) {
  check_attention_forward_dtypes(kernel, q, k, v, out, lse);
  RF_CHECK(grad_out.dtype == q.dtype && attention_output_dtype(q.dtype, grad_q.dtype) &&
               grad_k.dtype == grad_q.dtype && grad_v.dtype == grad_q.dtype &&
               (grad_q.dtype != DType::bf16 || out.dtype == DType::bf16),
           kernel, ": unsupported gradient dtypes (q ", dtype_name(q.dtype), ", out ",
           dtype_name(out.dtype), ", grad_out ", dtype_name(grad_out.dtype), ", grad_q ",
           dtype_name(grad_q.dtype), ", grad_k ", dtype_name(grad_k.dtype), ", grad_v ",
           dtype_name(grad_v.dtype),
           "): expected grad_out in q's dtype and grad_q, grad_k, grad_v of one dtype, f32 for "
           "f32 (f64 for f64), f32 or bf16 for bf16 (bf16 with a bf16 out)");
}

}  // namespace roformer::kernels

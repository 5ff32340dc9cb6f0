// rope_attention_{forward,backward} (core/kernels/kernel_list.h) composed of
// a device's rope and attention kernels: rotated copies of q and k in scratch
// memory, the attention kernel, and the gradients of the rotated q and k
// rotated back. The CPU's implementation, and the CUDA fallback for operands
// its fused kernel does not take. C++17 (nvcc reads it).
#pragma once

#include <cstddef>

#include "core/kernels/attention_dtypes.h"
#include "core/kernels/kernel_list.h"

namespace roformer::kernels::rope_composite {

// A token stream [T, H, D] seen as [H, T, D], the [..., S, D] shape the rope
// kernel rotates along S.
inline KernelTensor swap01(const KernelTensor& t) {
  return swapped(t, 0, 1);
}

// A contiguous tensor of `sizes_of`'s sizes over `data`.
inline KernelTensor dense(const KernelTensor& sizes_of, void* data, DType dtype) {
  KernelTensor out = sizes_of;
  out.data = data;
  out.dtype = dtype;
  int64_t s = 1;
  for (int32_t d = out.ndim - 1; d >= 0; --d) {
    out.strides[d] = s;
    s *= out.sizes[d];
  }
  return out;
}

inline size_t bytes_of(const KernelTensor& t, DType dtype) {
  return size_t(t.numel()) * dtype_size(dtype);
}

// x rotated (or rotated back) into `data`, returned in x's layout: padded
// [B, H, S, D] as is, a token stream [T, H, D] rotated as [H, T, D].
inline KernelTensor rotate_into(const KernelTable& kt, Stream stream, const KernelTensor& table,
                                bool interleaved, bool inverse, const KernelTensor& x, void* data) {
  const bool stream_layout = x.ndim == 3;
  const KernelTensor seq = stream_layout ? swap01(x) : x;
  const KernelTensor out = dense(seq, data, x.dtype);
  kt.rope(stream, seq, table, interleaved, inverse, out);
  return stream_layout ? swap01(out) : out;
}

// Alloc(bytes) returns an owner of scratch memory with get() -> void*.
template <class Alloc>
void forward(const KernelTable& kt, Stream stream, Alloc&& alloc, const AttentionParams& params,
             const KernelTensor& table, bool interleaved, const KernelTensor& q,
             const KernelTensor& k, const KernelTensor& v, const KernelTensor& mask_or_segments,
             const KernelTensor& out, const KernelTensor& lse, const KernelTensor& keep_bits) {
  check_attention_forward_dtypes("rope_attention kernel", q, k, v, out, lse);
  const auto q_mem = alloc(bytes_of(q, q.dtype));
  const auto k_mem = alloc(bytes_of(k, k.dtype));
  const KernelTensor rq = rotate_into(kt, stream, table, interleaved, false, q, q_mem.get());
  const KernelTensor rk = rotate_into(kt, stream, table, interleaved, false, k, k_mem.get());
  if (q.ndim == 3) {
    kt.attention_varlen_forward(stream, params, rq, rk, v, mask_or_segments, out, lse, keep_bits);
  } else {
    kt.attention_forward(stream, params, rq, rk, v, mask_or_segments, out, lse, keep_bits);
  }
}

// q and k rotated here, or as given (RopeInputs::rotated: the forward's
// rotated copies).
template <class Alloc>
void backward(const KernelTable& kt, Stream stream, Alloc&& alloc, const AttentionParams& params,
              const KernelTensor& table, bool interleaved, RopeInputs inputs, const KernelTensor& q,
              const KernelTensor& k, const KernelTensor& v, const KernelTensor& mask_or_segments,
              const KernelTensor& out, const KernelTensor& lse, const KernelTensor& keep_bits,
              const KernelTensor& grad_out, const KernelTensor& grad_q, const KernelTensor& grad_k,
              const KernelTensor& grad_v) {
  check_attention_backward_dtypes("rope_attention kernel", q, k, v, out, lse, grad_out, grad_q,
                                  grad_k, grad_v);
  const bool token_stream = q.ndim == 3;
  const bool rotate = inputs == RopeInputs::unrotated;
  const auto q_mem = alloc(rotate ? bytes_of(q, q.dtype) : 0);
  const auto k_mem = alloc(rotate ? bytes_of(k, k.dtype) : 0);
  const KernelTensor rq =
      rotate ? rotate_into(kt, stream, table, interleaved, false, q, q_mem.get()) : q;
  const KernelTensor rk =
      rotate ? rotate_into(kt, stream, table, interleaved, false, k, k_mem.get()) : k;
  // Gradients of the rotated q and k, in the layout rotate_into returns; a
  // token stream's rows outside every segment are not written: zeros. They
  // are kept in the accumulation dtype (f32, f64 for f64) and rotated back in
  // it: bf16 gradients are the f32 ones rounded once, by the final copy.
  const DType rot = attention_accumulator(q.dtype);
  const auto dq_mem = alloc(bytes_of(q, rot));
  const auto dk_mem = alloc(bytes_of(k, rot));
  auto layout = [&](const KernelTensor& x, void* data) {
    return token_stream ? swap01(dense(swap01(x), data, rot)) : dense(x, data, rot);
  };
  const KernelTensor dq_rot = layout(q, dq_mem.get());
  const KernelTensor dk_rot = layout(k, dk_mem.get());
  // The attention kernels write the three gradients in one dtype: a bf16
  // grad_v goes through accumulation-dtype scratch too. A token stream's
  // rows outside every segment come back as zeros in all three (the op may
  // hand over unwritten memory when every row is in a segment).
  const bool dv_scratch = grad_v.dtype != rot;
  const auto dv_mem = alloc(dv_scratch ? bytes_of(v, rot) : 0);
  const KernelTensor dv = dv_scratch ? dense(grad_v, dv_mem.get(), rot) : grad_v;
  if (token_stream) {
    kt.fill(stream, dq_rot, 0.0);
    kt.fill(stream, dk_rot, 0.0);
    if (dv_scratch) kt.fill(stream, dv, 0.0);
    kt.attention_varlen_backward(stream, params, rq, rk, v, mask_or_segments, out, lse, keep_bits,
                                 grad_out, dq_rot, dk_rot, dv);
  } else {
    kt.attention_backward(stream, params, rq, rk, v, mask_or_segments, out, lse, keep_bits,
                          grad_out, dq_rot, dk_rot, dv);
  }
  if (dv_scratch) kt.copy(stream, dv, grad_v);
  // Rotated back (the rotation is orthogonal) into the q and k scratch, then
  // copied into the callers' (possibly strided) gradients.
  const auto back_mem =
      alloc(bytes_of(q, rot) > bytes_of(k, rot) ? bytes_of(q, rot) : bytes_of(k, rot));
  kt.copy(stream, rotate_into(kt, stream, table, interleaved, true, dq_rot, back_mem.get()),
          grad_q);
  kt.copy(stream, rotate_into(kt, stream, table, interleaved, true, dk_rot, back_mem.get()),
          grad_k);
}

}  // namespace roformer::kernels::rope_composite

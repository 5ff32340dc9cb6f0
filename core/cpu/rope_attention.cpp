// Attention with RoPE inside on the CPU: the composition of the rope and
// attention kernels (core/kernels/rope_attention_composite.h), with host
// scratch for the rotated q and k.
#include <cstddef>
#include <memory>

#include "core/kernels/kernel_list.h"
#include "core/kernels/rope_attention_composite.h"

namespace roformer::kernels::cpu {

namespace {

auto host_scratch = [](size_t bytes) {
  return std::unique_ptr<std::byte[]>(new std::byte[bytes > 0 ? bytes : 1]);
};

}  // namespace

void rope_attention_forward(Stream stream, const AttentionParams& params, KT table,
                            bool interleaved, KT q, KT k, KT v, KT mask_or_segments, KT out, KT lse,
                            KT keep_bits) {
  rope_composite::forward(cpu_kernel_table, stream, host_scratch, params, table, interleaved, q, k,
                          v, mask_or_segments, out, lse, keep_bits);
}

void rope_attention_backward(Stream stream, const AttentionParams& params, KT table,
                             bool interleaved, RopeInputs inputs, KT q, KT k, KT v,
                             KT mask_or_segments, KT out, KT lse, KT keep_bits, KT grad_out,
                             KT grad_q, KT grad_k, KT grad_v) {
  rope_composite::backward(cpu_kernel_table, stream, host_scratch, params, table, interleaved,
                           inputs, q, k, v, mask_or_segments, out, lse, keep_bits, grad_out, grad_q,
                           grad_k, grad_v);
}

}  // namespace roformer::kernels::cpu

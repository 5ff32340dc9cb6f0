// Padded softmax attention through cuDNN's fused SDPA (core/cuda/cudnn_sdpa.h),
// taken by the list's attention kernels when params.engine is vendor.
// q, k, v (and grad_out) bf16 [B, H, S, D], any strides with a unit last one;
// out and the gradients bf16 or f32 (f32 through bf16 scratch); lse f32
// contiguous [B, H, Sq]; key_mask [B, Sk] any dtype, nonzero = keep, whose
// kept keys must come first in each row (one that does not is reported with
// params.mask_site; its row is computed with the first `count` keys). No dropout.
// A row with no kept key is not defined here (the CPU gives zeros): padded
// batches always keep their first token.
#pragma once

#include "core/kernels/kernel_list.h"

namespace roformer::kernels::cuda {

void cudnn_attention_forward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                             const KernelTensor& k, const KernelTensor& v,
                             const KernelTensor& key_mask, const KernelTensor& out,
                             const KernelTensor& lse);
void cudnn_attention_backward(Stream stream, const AttentionParams& params, const KernelTensor& q,
                              const KernelTensor& k, const KernelTensor& v,
                              const KernelTensor& key_mask, const KernelTensor& out,
                              const KernelTensor& lse, const KernelTensor& grad_out,
                              const KernelTensor& grad_q, const KernelTensor& grad_k,
                              const KernelTensor& grad_v);

}  // namespace roformer::kernels::cuda

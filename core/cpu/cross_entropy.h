// Fused log-softmax + negative log-likelihood over rows of logits [N, C].
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace roformer::cpu {

// For every row n whose target is not ignore_index: lse[n] = log sum_c
// exp(logits[n, c]) and loss[n] = lse[n] - logits[n, target[n]]; ignored
// rows get loss 0 (lse is still written). logits contiguous f32/bf16/f64,
// targets contiguous i32/i64 (already checked), lse and row_loss [N] f64.
// One pass over each row: a running max and sum, rescaled per chunk, with a
// vectorised exp; rows run in parallel.
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           const Tensor& lse, const Tensor& row_loss);

// grad[n, c] = (exp(logits[n, c] - lse[n]) - [c == target[n]]) * scale for
// counted rows, 0 for ignored rows; grad has logits' shape and dtype. One
// vectorised pass per row.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            const Tensor& lse, double scale, const Tensor& grad);

}  // namespace roformer::cpu

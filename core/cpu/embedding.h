// Embedding lookup and its scatter-add backward.
#pragma once

#include "core/tensor.h"

namespace roformer::cpu {

// Index of the first id outside [0, vocab) in contiguous ids (i32/i64), or -1.
int64_t embedding_first_bad_id(const Tensor& ids, int64_t vocab);

// out[n, :] = weight[ids[n], :] for contiguous weight [V, D], ids (n ids,
// already checked to be in range) and out [n, D].
void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out);

// grad_weight[ids[n], :] += grad_out[n, :] for n in order, into a zeroed
// grad_weight [V, D]. Threads split the D columns, never the ids, so every
// element is summed in the same order whatever the thread count (no atomics).
void embedding_backward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight);

}  // namespace roformer::cpu

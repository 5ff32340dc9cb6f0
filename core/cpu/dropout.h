// Dropout mask from Philox by the shared rule of core/philox.h: the decision
// for an element depends only on its (sequence, position, feature) and the
// site's key, never on the batch split, the padding or the thread count.
#pragma once

#include <cstdint>

#include "core/dropout_context.h"
#include "core/tensor.h"

namespace roformer::cpu {

// x and out contiguous, seen as [rows, positions, features]: out = keep ? x /
// (1 - p) : 0 where row r is sequence key.first_sequence + r of the global
// batch. The backward applies the identical mask by calling this again on the
// gradient.
void dropout(const Tensor& x, const Tensor& out, double p, const DropoutKey& key, int64_t rows,
             int64_t positions, int64_t features);

}  // namespace roformer::cpu

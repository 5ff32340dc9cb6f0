// Dropout mask from Philox: element i of a call keeps its value when the
// uniform number at word (offset + i) of the stream keyed by seed is >= p.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace roformer::cpu {

// out[i] = keep(seed, offset + i) ? x[i] / (1 - p) : 0 for contiguous x, out.
// The decision for element i depends only on (seed, offset, i) -- the same
// word Tensor::rand would draw there -- never on the thread count, so the
// backward applies the identical mask by calling this again on the gradient.
void dropout(const Tensor& x, const Tensor& out, double p, uint64_t seed, uint64_t offset);

}  // namespace roformer::cpu

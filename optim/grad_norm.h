// The global gradient norm and the clipping scale. The norm is a sum of
// squares in double over fixed-size chunks, added in chunk order, so it is
// the same bit for bit whatever the thread count. It is NaN or inf exactly
// when some gradient element is, which makes it the step's non-finite check
// too: clipping and the check cost one pass over the flat gradient buffer.
#pragma once

#include <cstdint>

#include "core/flat_parameters.h"

namespace roformer::optim {

// Elements per chunk of the deterministic sum (a multiple of every SIMD width).
inline constexpr int64_t kNormChunk = 16384;

// sum of x[i]^2 in double over a contiguous f32 CPU tensor, chunked as above.
double sum_of_squares(const Tensor& x);

// sqrt(sum of squares) over the flat gradient buffer (padding is zero).
double grad_norm(const FlatParameters& flat);

// The factor clipping multiplies gradients by: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm <= 0 (clipping off) or the norm is not finite.
double clip_scale(double norm, double max_norm);

}  // namespace roformer::optim

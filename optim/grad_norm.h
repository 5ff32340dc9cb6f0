// The global gradient norm and the clipping scale. The norm is a sum of
// squares in double over fixed-size chunks, added in chunk order, so it is
// the same bit for bit whatever the thread count. It is NaN or inf exactly
// when some gradient element is, which makes it the step's non-finite check
// too: clipping and the check cost one pass over the flat gradient buffer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/flat_parameters.h"

namespace roformer::optim {

// Elements per chunk of the deterministic sum (a multiple of every SIMD width).
inline constexpr int64_t kNormChunk = 16384;

// sum of x[i]^2 in double over a contiguous f32 CPU tensor, chunked as above.
double sum_of_squares(const Tensor& x);

// The chunk partials of sum_of_squares(x) for the elements [begin, end) of x:
// partials[c] for chunk begin / kNormChunk + c, bit for bit what the whole sum
// computes for that chunk. `begin` is a multiple of kNormChunk and `end` one
// too or x's end, so a range never splits a chunk. Adding every range's
// partials in chunk order gives sum_of_squares(x) exactly: how ZeRO-1's ranks,
// each holding its slice of the summed gradient, get the whole-gradient norm.
std::vector<double> chunk_sums_of_squares(const Tensor& x, int64_t begin, int64_t end);
// The partials added in order, as sum_of_squares adds them.
double sum_in_order(std::span<const double> partials);

// sqrt(sum of squares) of a contiguous f32 tensor on any device (the CPU's
// chunked sum, or the device's one pass): the trainer's update/weight ratio.
double l2_norm(const Tensor& x);

// sqrt(sum of squares) over the flat gradient buffer (padding is zero).
double grad_norm(const FlatParameters& flat);

// The factor clipping multiplies gradients by: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm <= 0 (clipping off) or the norm is not finite.
double clip_scale(double norm, double max_norm);

}  // namespace roformer::optim

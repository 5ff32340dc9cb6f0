// Rotary position embedding kernels (paper eq. 34): the cos/sin table for a
// set of positions and a strided rotation of [..., S, D] by it.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace roformer::cpu {

// cos/sin of m * base^(-2i/D) for each position m (row) and i in [0, D/2).
// Angles are computed in double; the f32 copy is what f32/bf16 rotate with.
struct RopeTable {
  int64_t positions = 0, half = 0;  // S rows of D/2 entries
  std::vector<double> cos64, sin64;
  std::vector<float> cos32, sin32;
};

// The table for these positions, head dim and base; the last few tables are
// cached (every layer asks for the same one, forward and backward).
std::shared_ptr<const RopeTable> rope_table(const std::vector<int64_t>& positions, int64_t dim,
                                            double base);

// out (contiguous, x's shape [..., S, D]) = x rotated pair-wise by the table's
// angles: pairs (2i, 2i+1) when `interleaved`, else (i, i + D/2). `inverse`
// rotates by minus the angle (the backward of the forward rotation). x may
// have any strides, broadcast dims included.
void rope(const Tensor& x, const RopeTable& table, bool interleaved, bool inverse,
          const Tensor& out);

}  // namespace roformer::cpu

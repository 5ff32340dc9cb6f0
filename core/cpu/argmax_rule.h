// The index max and argmax return along a dim on the CPU, and what the
// cross-entropy's accuracy compares with its target: the first NaN, else the
// first of the largest value. CUDA's reductions that split the scan combine
// by the same rule (argmax_wins, core/cuda/kernels/common.cuh).
#pragma once

#include <cmath>
#include <cstdint>

namespace roformer::kernels::cpu {

// Over p[0], p[stride], ..., p[(n - 1) * stride]; 0 when n is 0.
template <class T>
int64_t argmax_index(const T* p, int64_t n, int64_t stride = 1) {
  int64_t best = 0;
  if (n == 0) return best;
  double best_value = double(p[0]);
  for (int64_t i = 1; i < n; ++i) {
    const double v = double(p[i * stride]);
    if (v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
      best_value = v;
      best = i;
    }
  }
  return best;
}

}  // namespace roformer::kernels::cpu

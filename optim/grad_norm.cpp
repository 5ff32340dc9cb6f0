#include "optim/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "optim/device_passes.h"

namespace roformer::optim {

double sum_of_squares(const Tensor& x) {
  if (!x.device().is_cpu() || x.dtype() != DType::f32 || !x.is_contiguous())
    throw Error("sum_of_squares: expected a contiguous f32 CPU tensor, got " + x.desc());
  const float* d = x.data_as<float>();
  const int64_t n = x.numel();
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  // Each chunk's partial depends only on its elements, never on which thread
  // ran it; the partials are then added in a fixed order.
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kNormChunk, end = std::min(n, begin + kNormChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = begin; j < end; ++j) s += double(d[j]) * double(d[j]);
    partial[size_t(c)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

double grad_norm(const FlatParameters& flat) {
  if (!flat.device().is_cpu()) {
    // One pass and one 16-byte read back; a non-finite element makes the
    // norm NaN, as the CPU sum does.
    const device_passes::GradSummary s = device_passes::grad_summary(flat.grad());
    return s.non_finite ? std::numeric_limits<double>::quiet_NaN() : std::sqrt(s.sum_squares);
  }
  return std::sqrt(sum_of_squares(flat.grad()));
}

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0;
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace roformer::optim

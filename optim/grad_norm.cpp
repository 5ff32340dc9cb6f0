#include "optim/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/device_passes.h"

namespace roformer::optim {

namespace {

void check_f32_cpu(const Tensor& x, const char* what) {
  if (!x.device().is_cpu() || x.dtype() != DType::f32 || !x.is_contiguous())
    throw Error(std::string(what) + ": expected a contiguous f32 CPU tensor, got " + x.desc());
}

// One chunk's sum of squares. Never inlined: every caller runs this one
// compiled loop (the same vector width and order), so a chunk's partial is
// the same bits whether the whole buffer or a slice of it is summed.
[[gnu::noinline]] double chunk_sum(const float* d, int64_t begin, int64_t end) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = begin; j < end; ++j) s += double(d[j]) * double(d[j]);
  return s;
}

// Partials of the chunks of [begin, end) (begin a multiple of kNormChunk).
std::vector<double> partials(const float* d, int64_t begin, int64_t end) {
  const int64_t chunks = (end - begin + kNormChunk - 1) / kNormChunk;
  // Each chunk's partial depends only on its elements, never on which thread
  // ran it; the partials are then added in a fixed order.
  std::vector<double> out(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = begin + c * kNormChunk;
    out[size_t(c)] = chunk_sum(d, lo, std::min(end, lo + kNormChunk));
  }
  return out;
}

}  // namespace

double sum_in_order(std::span<const double> partials) {
  double total = 0.0;
  for (double s : partials) total += s;
  return total;
}

double sum_of_squares(const Tensor& x) {
  check_f32_cpu(x, "sum_of_squares");
  return sum_in_order(partials(x.data_as<float>(), 0, x.numel()));
}

std::vector<double> chunk_sums_of_squares(const Tensor& x, int64_t begin, int64_t end) {
  check_f32_cpu(x, "chunk_sums_of_squares");
  RF_CHECK(begin >= 0 && begin <= end && end <= x.numel() && begin % kNormChunk == 0 &&
               (end % kNormChunk == 0 || end == x.numel()),
           "chunk_sums_of_squares: [", begin, ", ", end, ") of ", x.numel(),
           " elements does not follow the chunks of ", kNormChunk);
  return partials(x.data_as<float>(), begin, end);
}

double l2_norm(const Tensor& x) {
  if (!x.device().is_cpu()) {
    // One pass and one 16-byte read back; a non-finite element makes the
    // norm NaN, as the CPU sum does.
    const device_passes::GradSummary s = device_passes::grad_summary(x, "l2_norm's input");
    return s.non_finite ? std::numeric_limits<double>::quiet_NaN() : std::sqrt(s.sum_squares);
  }
  return std::sqrt(sum_of_squares(x));
}

double grad_norm(const FlatParameters& flat) {
  return l2_norm(flat.grad());
}

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0;
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace roformer::optim

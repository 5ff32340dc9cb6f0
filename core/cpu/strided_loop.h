// Strided element loops shared by the CPU kernels: views of any geometry
// (transposed, narrowed, broadcast with stride 0) are walked directly, the
// innermost dimension as a tight loop, the rest split across OpenMP threads.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <vector>

#include "core/cpu/view.h"

namespace roformer::kernels::cpu {

// An exception must not leave an OpenMP region (the runtime calls
// std::terminate). Each iteration runs under guard(); the first exception is
// kept, later iterations are skipped, and rethrow() raises it after the region.
class RegionErrors {
 public:
  template <class Fn>
  void guard(Fn&& fn) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

// Minimum number of elements before a loop is split across threads.
constexpr int64_t kParallelGrain = 32768;

template <size_t N>
struct StridedPlan {
  std::vector<int64_t> sizes;                   // coalesced, innermost last
  std::array<std::vector<int64_t>, N> strides;  // per operand, in elements
};

// Merges adjacent dims that are contiguous for every operand and drops size-1
// dims, so most loops become one long inner loop.
template <size_t N>
StridedPlan<N> make_plan(const Shape& shape, const std::array<const Shape*, N>& strides) {
  StridedPlan<N> plan;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !plan.sizes.empty();
    for (size_t k = 0; k < N && merge; ++k)
      merge = plan.strides[k].back() == (*strides[k])[d] * shape[d];
    if (merge) {
      plan.sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) plan.strides[k].back() = (*strides[k])[d];
    } else {
      plan.sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) plan.strides[k].push_back((*strides[k])[d]);
    }
  }
  if (plan.sizes.empty()) {
    plan.sizes.push_back(1);
    for (size_t k = 0; k < N; ++k) plan.strides[k].push_back(0);
  }
  return plan;
}

// Calls fn(offsets, n, inner_strides) for each run of the innermost dim, where
// offsets are element offsets of each operand at the run's start.
template <size_t N, class Fn>
void for_each_run(const Shape& shape, const std::array<const Shape*, N>& strides, Fn&& fn) {
  const StridedPlan<N> plan = make_plan<N>(shape, strides);
  const int64_t ndim = int64_t(plan.sizes.size());
  const int64_t inner = plan.sizes.back();
  int64_t outer = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) outer *= plan.sizes[d];
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = plan.strides[k].back();

  auto run = [&](int64_t o) {
    std::array<int64_t, N> offsets{};
    int64_t rest = o;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t i = rest % plan.sizes[d];
      rest /= plan.sizes[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += i * plan.strides[k][d];
    }
    fn(offsets, inner, inner_strides);
  };
  if (outer * inner >= kParallelGrain && outer > 1) {
    RegionErrors errors;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) errors.guard([&] { run(o); });
    errors.rethrow();
  } else {
    for (int64_t o = 0; o < outer; ++o) run(o);
  }
}

// Splits [0, n) into rows and runs fn(row) in parallel when the total work
// (n * work_per_row) is large enough.
template <class Fn>
void parallel_rows(int64_t n, int64_t work_per_row, Fn&& fn) {
  if (n * work_per_row >= kParallelGrain && n > 1) {
    RegionErrors errors;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) errors.guard([&] { fn(i); });
    errors.rethrow();
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace roformer::kernels::cpu

// The optimizer's passes when the flat buffers live on a GPU
// (core/cuda/optimizer.h): the gradient's sum of squares and non-finite
// count, read back in one 16-byte copy (the step's one wait for the device),
// and the fused AdamW update. The CPU passes are in adamw.cpp and
// grad_norm.cpp; these take the same inputs. In a build without CUDA they
// throw naming the device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace roformer::optim::device_passes {

struct GradSummary {
  double sum_squares = 0;   // f64, in an order fixed by the length alone
  uint64_t non_finite = 0;  // NaN and infinite elements
};
// The sum of squares and the non-finite count of a flat f32 GPU tensor;
// `what` names it in the error for anything else.
GradSummary grad_summary(const Tensor& flat_grad, const char* what = "the gradient");

// A run [begin, end) of the flat buffers updated with one decay setting;
// elements outside every run are left untouched.
struct Run {
  int64_t begin = 0, end = 0;
  bool decay = true;
};
struct AdamWStep {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f;
  float step_size = 0;  // lr / (1 - beta1^t)
  float bc2_sqrt = 1;   // sqrt(1 - beta2^t)
  float grad_scale = 1;
  float decay = 1;  // 1 - lr * weight_decay
};
// One update of `param` from `grad` with moments `m` and `v` (flat f32
// buffers of one length on one GPU), over `runs` (sorted, disjoint). When
// `working_bf16` is defined (contiguous bf16 of that length, same GPU) the
// same pass writes every element of the updated `param` into it rounded to
// bf16, the ones outside the runs included. With `update_sum_squares` the
// pass also sums (new - old)^2 over the buffers in f64 (an order fixed by
// the length) and returns it there: one wait for the device.
void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
           const std::vector<Run>& runs, const AdamWStep& step,
           const Tensor& working_bf16 = Tensor(), double* update_sum_squares = nullptr);

// The runs as the kernel's segments covering [0, n): starts (num_segments + 1
// entries, the last n) and a mode per segment (0 no decay, 1 decay, 2 skip).
// Device-independent, so the CPU tests check it.
struct Segments {
  std::vector<int64_t> starts;
  std::vector<uint8_t> modes;
};
Segments segments_of(const std::vector<Run>& runs, int64_t n);

}  // namespace roformer::optim::device_passes

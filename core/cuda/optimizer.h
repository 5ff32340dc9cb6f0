// The optimizer's passes over the flat parameter and gradient buffers, on the
// device: the gradient's global norm and non-finite count (read back once per
// step), and one fused AdamW pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace roformer::cuda {

// Written by grad_norm_stats on the device.
struct GradStats {
  double sum_squares;   // in f64, summed in a fixed order: the same on every run
  uint64_t non_finite;  // count of NaN and infinite gradient elements
};

// Queues sum(g^2) and the non-finite count of g[0, n) into *out (device memory,
// at least sizeof(GradStats)); `scratch` is device memory of
// grad_norm_scratch_bytes(). The order of summation depends only on n.
size_t grad_norm_scratch_bytes();
void grad_norm_stats(const float* g, int64_t n, GradStats* out, void* scratch, cudaStream_t stream);

// One AdamW step over flat buffers, in torch.optim.AdamW's order of operations
// and rounding (decay, moments, update; no fused multiply-adds), so it gives
// the CPU optimizer's results bit for bit.
struct AdamWArgs {
  float lr = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float step_size = 0.0f;   // lr / (1 - beta1^t)
  float bc2_sqrt = 1.0f;    // sqrt(1 - beta2^t)
  float grad_scale = 1.0f;  // clipping coefficient (and 1 / loss scale)
  float decay = 1.0f;       // 1 - lr * weight_decay, for segments that decay
};

// What a segment's elements get.
enum SegmentMode : uint8_t {
  kSegmentNoDecay = 0,  // the update without weight decay (biases, LayerNorm)
  kSegmentDecay = 1,    // the update with weight decay
  kSegmentSkip = 2,     // untouched (parameters that received no gradient)
};

// Parameters [0, n) are split in segments [starts[i], starts[i + 1]) (device
// array of num_segments + 1 entries) with segment_decays[i] a SegmentMode.
// `working_bf16` (may be null) receives every parameter (updated or skipped)
// rounded to nearest-even bf16 in the same pass: the weights the bf16 matrix
// products read (core/precision.h, set_bf16_working_copy).
// With `update_sum_squares` (device memory, one double) the same pass also
// queues sum((new - old)^2) over [0, n) into it, in f64 and in an order fixed
// by n (the update/weight ratio's numerator without a copy of the weights);
// `scratch` is then device memory of adamw_update_scratch_bytes().
size_t adamw_update_scratch_bytes();
void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                uint16_t* working_bf16, int64_t n, const int64_t* segment_starts,
                const uint8_t* segment_decays, int num_segments, const AdamWArgs& args,
                cudaStream_t stream, double* update_sum_squares = nullptr, void* scratch = nullptr);

}  // namespace roformer::cuda

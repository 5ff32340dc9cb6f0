#include <cuda_bf16.h>

#include "core/cuda/check.h"
#include "core/cuda/kernels/common.cuh"
#include "core/cuda/optimizer.h"

namespace roformer::cuda {

namespace {

// The kernels' deterministic block reduction (a fixed order for a block
// size) and launch size.
using kernels::cuda::block_sum;
using kernels::cuda::grid_for;

constexpr int kNormBlocks = 512;  // fixed, so the summation order depends only on n
constexpr int kNormThreads = 256;

__global__ void grad_norm_partials(const float* __restrict__ g, int64_t n,
                                   double* __restrict__ sums,
                                   unsigned long long* __restrict__ bad) {
  __shared__ double shared_sum[32];
  __shared__ unsigned long long shared_bad[32];
  double sum = 0.0;
  unsigned long long count = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = g[i];
    sum += double(x) * double(x);
    count += isfinite(x) ? 0ull : 1ull;
  }
  const double block_total = block_sum(sum, shared_sum);
  const unsigned long long block_bad = block_sum(count, shared_bad);
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = block_total;
    bad[blockIdx.x] = block_bad;
  }
}

__global__ void grad_norm_finish(const double* __restrict__ sums,
                                 const unsigned long long* __restrict__ bad,
                                 GradStats* __restrict__ out) {
  __shared__ double shared_sum[32];
  __shared__ unsigned long long shared_bad[32];
  const double total = block_sum(sums[threadIdx.x], shared_sum);
  const unsigned long long total_bad = block_sum(bad[threadIdx.x], shared_bad);
  if (threadIdx.x == 0) {
    out->sum_squares = total;
    out->non_finite = total_bad;
  }
}

// kMeasure: also sums (new - old)^2 of every element in f64 and writes the
// block's total to update_partials[blockIdx.x] (launched on kNormBlocks
// blocks of kNormThreads, so the order depends only on n).
template <bool kMeasure>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v,
                             __nv_bfloat16* __restrict__ working, int64_t n,
                             const int64_t* __restrict__ starts, const uint8_t* __restrict__ decays,
                             int num_segments, AdamWArgs a, double* __restrict__ update_partials) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  double update_sq = 0.0;
  const float one_minus_b1 = 1.0f - a.beta1, one_minus_b2 = 1.0f - a.beta2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // The segment holding i: the last start <= i (binary search).
    int lo = 0, hi = num_segments - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (starts[mid] <= i)
        lo = mid;
      else
        hi = mid - 1;
    }
    if (decays[lo] == kSegmentSkip) {
      // Untouched, but the working copy must still hold every parameter.
      if (working) working[i] = __float2bfloat16_rn(p[i]);
      continue;
    }
    const float decay = decays[lo] == kSegmentDecay ? a.decay : 1.0f;
    // Explicit rounding intrinsics: no contraction into FMAs, as on the CPU.
    const float gi = __fmul_rn(g[i], a.grad_scale);
    float pi = __fmul_rn(p[i], decay);
    const float mi = __fadd_rn(__fmul_rn(a.beta1, m[i]), __fmul_rn(one_minus_b1, gi));
    const float vi =
        __fadd_rn(__fmul_rn(a.beta2, v[i]), __fmul_rn(__fmul_rn(one_minus_b2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
    pi = __fsub_rn(pi, __fdiv_rn(__fmul_rn(a.step_size, mi), denom));
    if constexpr (kMeasure) {
      const double change = double(__fsub_rn(pi, p[i]));  // the f32 difference, as after - before
      update_sq += change * change;
    }
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (working) working[i] = __float2bfloat16_rn(pi);
  }
  if constexpr (kMeasure) {
    __shared__ double shared_sum[32];
    const double block_total = block_sum(update_sq, shared_sum);
    if (threadIdx.x == 0) update_partials[blockIdx.x] = block_total;
  }
}

// The kNormBlocks partial sums into *out, in a fixed order.
__global__ void sum_partials(const double* __restrict__ partials, double* __restrict__ out) {
  __shared__ double shared_sum[32];
  const double total = block_sum(partials[threadIdx.x], shared_sum);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace

size_t grad_norm_scratch_bytes() {
  return kNormBlocks * (sizeof(double) + sizeof(unsigned long long));
}

void grad_norm_stats(const float* g, int64_t n, GradStats* out, void* scratch,
                     cudaStream_t stream) {
  auto* sums = static_cast<double*>(scratch);
  auto* bad = reinterpret_cast<unsigned long long*>(sums + kNormBlocks);
  RF_LAUNCH(grad_norm_partials, kNormBlocks, kNormThreads, 0, stream, g, n, sums, bad);
  RF_LAUNCH(grad_norm_finish, 1, kNormBlocks, 0, stream, sums, bad, out);
}

size_t adamw_update_scratch_bytes() {
  return kNormBlocks * sizeof(double);
}

void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                uint16_t* working_bf16, int64_t n, const int64_t* segment_starts,
                const uint8_t* segment_decays, int num_segments, const AdamWArgs& args,
                cudaStream_t stream, double* update_sum_squares, void* scratch) {
  auto* working = reinterpret_cast<__nv_bfloat16*>(working_bf16);
  if (update_sum_squares) {
    // Every block writes its partial, so n = 0 gives 0.
    auto* partials = static_cast<double*>(scratch);
    RF_LAUNCH(adamw_kernel<true>, kNormBlocks, kNormThreads, 0, stream, params, grads, exp_avg,
              exp_avg_sq, working, n, segment_starts, segment_decays, num_segments, args, partials);
    RF_LAUNCH(sum_partials, 1, kNormBlocks, 0, stream, partials, update_sum_squares);
    return;
  }
  if (n == 0) return;
  constexpr int kThreads = 256;
  RF_LAUNCH(adamw_kernel<false>, grid_for(n, kThreads), kThreads, 0, stream, params, grads, exp_avg,
            exp_avg_sq, working, n, segment_starts, segment_decays, num_segments, args, nullptr);
}

}  // namespace roformer::cuda

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

// Packs of eight floats (two 16-byte words): a thread of one scalar load at a
// time kept too few bytes in flight to reach the memory's bandwidth.
using kernels::cuda::on_pack_boundary;
using kernels::cuda::Pack8;
constexpr int kPack = 8;

__host__ __device__ inline int64_t packs_of(int64_t n) {
  return (n + kPack - 1) / kPack;
}

// Each thread takes packs j, j + stride, ... two at a time (both loads in
// flight before either is summed), their elements in order: the order of
// summation depends only on n (the grid is fixed). `aligned`: g starts on a
// pack boundary, else every element is loaded alone (the same order).
__global__ void grad_norm_partials(const float* __restrict__ g, int64_t n, bool aligned,
                                   double* __restrict__ sums,
                                   unsigned long long* __restrict__ bad) {
  __shared__ double shared_sum[32];
  __shared__ unsigned long long shared_bad[32];
  double sum = 0.0;
  unsigned long long count = 0;
  const auto add = [&](float x) {
    sum += double(x) * double(x);
    count += isfinite(x) ? 0ull : 1ull;
  };
  const auto add_pack = [&](const Pack8<float>& pack) {
#pragma unroll
    for (int e = 0; e < kPack; ++e) add(pack.v[e]);
  };
  const int64_t packs = packs_of(n), whole = aligned ? n / kPack : 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const auto* in = reinterpret_cast<const Pack8<float>*>(g);
  int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; j + stride < whole; j += 2 * stride) {
    const Pack8<float> first = in[j], second = in[j + stride];
    add_pack(first);
    add_pack(second);
  }
  for (; j < packs; j += stride) {
    if (j < whole) {
      add_pack(in[j]);
      continue;
    }
    const int64_t end = (j + 1) * kPack < n ? (j + 1) * kPack : n;
    for (int64_t i = j * kPack; i < end; ++i) add(g[i]);
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

// One element's AdamW update, in torch.optim.AdamW's order. Explicit rounding
// intrinsics: no contraction into FMAs, as on the CPU.
__device__ __forceinline__ float adamw_update(float p, float g, float& m, float& v, float decay,
                                              const AdamWArgs& a) {
  const float one_minus_b1 = 1.0f - a.beta1, one_minus_b2 = 1.0f - a.beta2;
  const float gi = __fmul_rn(g, a.grad_scale);
  const float pi = __fmul_rn(p, decay);
  m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(one_minus_b1, gi));
  v = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(one_minus_b2, gi), gi));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bc2_sqrt), a.eps);
  return __fsub_rn(pi, __fdiv_rn(__fmul_rn(a.step_size, m), denom));
}

// The segment holding element i: the last start <= i (binary search).
__device__ __forceinline__ int segment_of(const int64_t* __restrict__ starts, int num_segments,
                                          int64_t i) {
  int lo = 0, hi = num_segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// A thread per pack of eight elements (grid-stride): a pack inside one
// segment, with every buffer on a pack boundary (`aligned`), moves as whole
// 16-byte words and finds its segment once; a pack across a segment's end (a
// parameter's last elements before the flat set's padding) or of unaligned
// buffers takes its elements one by one. The same operations either way.
// kMeasure: also sums (new - old)^2 of every element in f64 and writes the
// block's total to update_partials[blockIdx.x] (launched on kNormBlocks
// blocks of kNormThreads, so the order depends only on n).
template <bool kMeasure>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v,
                             __nv_bfloat16* __restrict__ working, int64_t n, bool aligned,
                             const int64_t* __restrict__ starts, const uint8_t* __restrict__ decays,
                             int num_segments, AdamWArgs a, double* __restrict__ update_partials) {
  double update_sq = 0.0;
  const auto measure = [&](float before, float after) {
    if constexpr (kMeasure) {
      // The f32 difference, as after - before.
      const double change = double(__fsub_rn(after, before));
      update_sq += change * change;
    }
  };
  const int64_t packs = packs_of(n);
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < packs;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t begin = j * kPack, end = begin + kPack < n ? begin + kPack : n;
    const int seg = segment_of(starts, num_segments, begin);
    if (aligned && end == begin + kPack && starts[seg + 1] >= end) {
      const uint8_t mode = decays[seg];
      Pack8<float> pp = reinterpret_cast<const Pack8<float>*>(p)[j];
      if (mode != kSegmentSkip) {
        const float decay = mode == kSegmentDecay ? a.decay : 1.0f;
        const Pack8<float> gp = reinterpret_cast<const Pack8<float>*>(g)[j];
        Pack8<float> mp = reinterpret_cast<const Pack8<float>*>(m)[j];
        Pack8<float> vp = reinterpret_cast<const Pack8<float>*>(v)[j];
#pragma unroll
        for (int e = 0; e < kPack; ++e) {
          const float updated = adamw_update(pp.v[e], gp.v[e], mp.v[e], vp.v[e], decay, a);
          measure(pp.v[e], updated);
          pp.v[e] = updated;
        }
        reinterpret_cast<Pack8<float>*>(m)[j] = mp;
        reinterpret_cast<Pack8<float>*>(v)[j] = vp;
        reinterpret_cast<Pack8<float>*>(p)[j] = pp;
      }
      // Skipped or not, the working copy holds every parameter.
      if (working) {
        Pack8<__nv_bfloat16> low;
#pragma unroll
        for (int e = 0; e < kPack; ++e) low.v[e] = __float2bfloat16_rn(pp.v[e]);
        reinterpret_cast<Pack8<__nv_bfloat16>*>(working)[j] = low;
      }
      continue;
    }
    // The pack's elements in order: each one's segment is the pack's first
    // one's or a later one (starts[num_segments] = n ends the walk).
    for (int64_t i = begin, s = seg; i < end; ++i) {
      while (starts[s + 1] <= i) ++s;
      const uint8_t mode = decays[s];
      if (mode == kSegmentSkip) {
        if (working) working[i] = __float2bfloat16_rn(p[i]);
        continue;
      }
      float mi = m[i], vi = v[i];
      const float updated =
          adamw_update(p[i], g[i], mi, vi, mode == kSegmentDecay ? a.decay : 1.0f, a);
      measure(p[i], updated);
      m[i] = mi;
      v[i] = vi;
      p[i] = updated;
      if (working) working[i] = __float2bfloat16_rn(updated);
    }
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
  RF_LAUNCH(grad_norm_partials, kNormBlocks, kNormThreads, 0, stream, g, n, on_pack_boundary(g),
            sums, bad);
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
  const bool aligned = on_pack_boundary(params) && on_pack_boundary(grads) &&
                       on_pack_boundary(exp_avg) && on_pack_boundary(exp_avg_sq) &&
                       (!working || on_pack_boundary(working));
  if (update_sum_squares) {
    // Every block writes its partial, so n = 0 gives 0.
    auto* partials = static_cast<double*>(scratch);
    RF_LAUNCH(adamw_kernel<true>, kNormBlocks, kNormThreads, 0, stream, params, grads, exp_avg,
              exp_avg_sq, working, n, aligned, segment_starts, segment_decays, num_segments, args,
              partials);
    RF_LAUNCH(sum_partials, 1, kNormBlocks, 0, stream, partials, update_sum_squares);
    return;
  }
  if (n == 0) return;
  constexpr int kThreads = 256;
  RF_LAUNCH(adamw_kernel<false>, grid_for(packs_of(n), kThreads), kThreads, 0, stream, params,
            grads, exp_avg, exp_avg_sq, working, n, aligned, segment_starts, segment_decays,
            num_segments, args, nullptr);
}

}  // namespace roformer::cuda

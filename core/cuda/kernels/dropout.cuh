// Hidden-state dropout on the GPU: one thread per counter block of the shared
// rule (core/philox.h), so a Philox call serves the eight features it
// decides rather than being redrawn by each of them.
#pragma once

#include <cstdint>

#include "core/cuda/kernels/common.cuh"
#include "core/dropout_context.h"
#include "core/philox.h"

namespace roformer::kernels::cuda {

// Features [8 group, 8 group + 8) of one token (row `sequence` of the global
// batch, `position`), x and out pointing at the token's first feature; as
// one Pack8 each way where the group is whole and aligned (eight scalar
// accesses a lane, 16-64 B apart, would touch 8x the sectors).
template <class T>
__device__ __forceinline__ void drop_feature_group(const T* x, T* out, int64_t features,
                                                   int64_t group, uint32_t sequence,
                                                   uint32_t position, const PhiloxKey& pkey,
                                                   uint32_t site, uint32_t threshold,
                                                   acc_t<T> scale) {
  using A = acc_t<T>;
  const PhiloxCounter words =
      philox4x32(dropout_block(uint32_t(group), position, sequence, site, 0), pkey);
  const int64_t f0 = group * kDropoutDrawsPerBlock;
  auto kept = [&](uint32_t d, T value) {
    return dropout_draw_of(words, d) >= threshold ? convert<T>(convert<A>(value) * scale)
                                                  : convert<T>(0.0f);
  };
  const bool whole = f0 + int64_t(kDropoutDrawsPerBlock) <= features &&
                     reinterpret_cast<uintptr_t>(x + f0) % alignof(Pack8<T>) == 0 &&
                     reinterpret_cast<uintptr_t>(out + f0) % alignof(Pack8<T>) == 0;
  if (whole) {
    const Pack8<T> in = *reinterpret_cast<const Pack8<T>*>(x + f0);
    Pack8<T> result;
#pragma unroll
    for (uint32_t d = 0; d < kDropoutDrawsPerBlock; ++d) result.v[d] = kept(d, in.v[d]);
    *reinterpret_cast<Pack8<T>*>(out + f0) = result;
    return;
  }
#pragma unroll
  for (uint32_t d = 0; d < kDropoutDrawsPerBlock; ++d) {
    const int64_t f = f0 + d;
    if (f < features) out[f] = kept(d, x[f]);
  }
}

// Counter blocks per token of `features` features.
__host__ __device__ inline int64_t dropout_groups(int64_t features) {
  return (features + kDropoutDrawsPerBlock - 1) / kDropoutDrawsPerBlock;
}

}  // namespace roformer::kernels::cuda

// Hidden-state dropout on the GPU: one thread per counter block of the shared
// rule (core/philox.h), so a Philox call serves the eight features it
// decides rather than being redrawn by each of them.
#pragma once

#include <cstdint>

#include "core/cuda/kernels/common.cuh"
#include "core/dropout_context.h"
#include "core/philox.h"

namespace roformer::kernels::cuda {

// a * b rounded on its own: nvcc never contracts it with a later add into a
// fused multiply-add, so a dropped value added to a residual in the same
// kernel (layer_norm.cu) has the bits of dropout's output added by another.
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}

// One element of dropout's output: value scaled by 1 / (1 - p) when kept,
// else zero, rounded to T as the CPU's loop does.
template <class T>
__device__ __forceinline__ T scaled_or_zero(bool kept, T value, acc_t<T> scale) {
  return kept ? convert<T>(mul_rn(convert<acc_t<T>>(value), scale)) : convert<T>(0.0f);
}
// The same for the element whose draw is `draw`.
template <class T>
__device__ __forceinline__ T dropped(uint32_t draw, uint32_t threshold, T value, acc_t<T> scale) {
  return scaled_or_zero(draw >= threshold, value, scale);
}

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
  const PhiloxCounter words =
      philox4x32(dropout_block(uint32_t(group), position, sequence, site, 0), pkey);
  const int64_t f0 = group * kDropoutDrawsPerBlock;
  auto kept = [&](uint32_t d, T value) {
    return dropped(dropout_draw_of(words, d), threshold, value, scale);
  };
  const bool whole = f0 + int64_t(kDropoutDrawsPerBlock) <= features && on_pack_boundary(x + f0) &&
                     on_pack_boundary(out + f0);
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

// ResidualDropout (core/kernels/kernel_list.h) as the layer-norm kernels read
// it: `on` false for none.
struct RowDropout {
  bool on = false;
  PhiloxKey pkey{};
  uint32_t site = 0, threshold = 0;
  double scale = 1.0;  // 1 / (1 - p); a kernel takes acc_t<T>(scale), as the CPU does
  int64_t first_sequence = 0, positions = 1;
  const int64_t* tokens = nullptr;  // [rows, 2] (row, position), or null: r / positions

  // Row r's token in the global batch: (sequence, position).
  __device__ __forceinline__ void token(int64_t r, uint32_t& sequence, uint32_t& position) const {
    const int64_t row = tokens ? tokens[2 * r] : r / positions;
    position = uint32_t(tokens ? tokens[2 * r + 1] : r % positions);
    sequence = uint32_t(first_sequence + row);
  }
  // The four words deciding features [8 group, 8 group + 8) of a token.
  __device__ __forceinline__ PhiloxCounter words(uint32_t sequence, uint32_t position,
                                                 int64_t group) const {
    return philox4x32(dropout_block(uint32_t(group), position, sequence, site, 0), pkey);
  }
  // The draw of feature `inner` alone (one Philox call a feature: for
  // kernels whose threads do not hold a whole block).
  __device__ __forceinline__ uint32_t draw(uint32_t sequence, uint32_t position,
                                           int64_t inner) const {
    return dropout_draw(pkey, uint32_t(inner), position, sequence, site, 0);
  }
  // The same decisions as eight bits (bit e: feature 8 group + e kept): one
  // register to carry where the words' would not fit.
  __device__ __forceinline__ uint32_t keep_bits(uint32_t sequence, uint32_t position,
                                                int64_t group) const {
    const PhiloxCounter w = words(sequence, position, group);
    uint32_t bits = 0;
#pragma unroll
    for (uint32_t e = 0; e < kDropoutDrawsPerBlock; ++e)
      bits |= uint32_t(dropout_draw_of(w, e) >= threshold) << e;
    return bits;
  }
};

// Counter blocks per token of `features` features.
__host__ __device__ inline int64_t dropout_groups(int64_t features) {
  return (features + kDropoutDrawsPerBlock - 1) / kDropoutDrawsPerBlock;
}

}  // namespace roformer::kernels::cuda

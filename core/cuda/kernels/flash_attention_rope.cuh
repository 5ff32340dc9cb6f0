// RoPE inside the flash kernels: Q and K rotated in shared memory as their
// tiles arrive (each thread its own 16-byte chunks, which hold whole pairs
// in either layout), the angles read from the table [2, P, 32] or staged by
// cp.async beside the tile, and gradients rotated back as they are written.
#pragma once

#include "core/cuda/kernels/flash_attention_mma.cuh"

namespace roformer::kernels::cuda {

namespace {

// Rotates the pair (x0, x1) by the angle whose cosine and sine are c, s
// (the backward passes -s: the inverse rotation).
__device__ __forceinline__ void rotate_pair(float& x0, float& x1, float c, float s) {
  const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
  x0 = y0;
  x1 = y1;
}

// Row `pos` of the RoPE table [2, P, 32]: its cosines and its sines.
struct AngleRows {
  const float* cos;
  const float* sin;
};
__device__ __forceinline__ AngleRows angle_rows(const FlashArgs& a, int64_t pos) {
  return {a.table + pos * (kD / 2), a.table + (a.table_rows + pos) * (kD / 2)};
}

// A thread moves dims [8c, 8c + 8) (lo) and [8c + 32, 8c + 40) (hi) of a row,
// which hold eight whole RoPE pairs in either layout. Its local pair n is
// pair chunk_pair(n, c) of the table: interleaved, 4c..4c+3 (in lo) then
// 16+4c..16+4c+3 (in hi); half, 8c..8c+7 (across lo and hi). Local pairs
// 0..3 and 4..7 are each four consecutive table columns.
__device__ __forceinline__ int chunk_pair(int n, int c, bool interleaved) {
  return interleaved ? (n < 4 ? 4 * c + n : 16 + 4 * c + n - 4) : 8 * c + n;
}

// The cosines and sines of a chunk's eight local pairs at one position.
struct ChunkAngles {
  float cos[8], sin[8];
};

__device__ __forceinline__ ChunkAngles angles_from_table(const FlashArgs& a, int64_t pos, int c) {
  ChunkAngles r;
  const AngleRows row = angle_rows(a, pos);
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const int k = chunk_pair(n, c, a.interleaved);
    r.cos[n] = row.cos[k];
    r.sin[n] = row.sin[k];
  }
  return r;
}

// A chunk's angles staged in shared memory by copy_angles_async: a slot of
// kAngleSlot floats holding cos 0..7 then sin 0..7 (the 16 B loads of eight
// consecutive threads fall in distinct bank groups: 20 is 5 chunks of 16 B).
constexpr int kAngleSlot = 20;

__device__ __forceinline__ ChunkAngles angles_from_slot(const float* slot) {
  ChunkAngles r;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const float4 c = reinterpret_cast<const float4*>(slot)[q];
    const float4 s = reinterpret_cast<const float4*>(slot + 8)[q];
    r.cos[4 * q] = c.x, r.cos[4 * q + 1] = c.y, r.cos[4 * q + 2] = c.z, r.cos[4 * q + 3] = c.w;
    r.sin[4 * q] = s.x, r.sin[4 * q + 1] = s.y, r.sin[4 * q + 2] = s.z, r.sin[4 * q + 3] = s.w;
  }
  return r;
}

// The cosine and sine of table pair k at row `row` of the slots
// copy_angles_async staged (4 slots a row: the inverse of chunk_pair).
__device__ __forceinline__ float2 slot_angle(const float* slots, int row, int k, bool interleaved) {
  const int c = interleaved ? (k & 15) >> 2 : k >> 3;
  const int n = interleaved ? (k >> 4) * 4 + (k & 3) : k & 7;
  const float* slot = slots + (row * 4 + c) * kAngleSlot;
  return make_float2(slot[n], slot[8 + n]);
}

// Rotates the values of chunk c of a row (x: dims 8c..., y: 8c + 32...) by
// its eight angles, or by minus them when `inverse` (a gradient rotated back).
__device__ __forceinline__ void rotate_chunk_values(float (&x)[8], float (&y)[8],
                                                    const ChunkAngles& w, bool interleaved,
                                                    bool inverse) {
  const float sign = inverse ? -1.0f : 1.0f;
  if (interleaved) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      rotate_pair(x[2 * m], x[2 * m + 1], w.cos[m], sign * w.sin[m]);
      rotate_pair(y[2 * m], y[2 * m + 1], w.cos[4 + m], sign * w.sin[4 + m]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) rotate_pair(x[e], y[e], w.cos[e], sign * w.sin[e]);
  }
}

// Rotates chunk c of a row (lo, hi as above) by its eight angles.
__device__ __forceinline__ void rotate_chunks(uint4& lo, uint4& hi, const ChunkAngles& w,
                                              bool interleaved) {
  float x[8], y[8];
  const bf16_t* pl = reinterpret_cast<const bf16_t*>(&lo);
  const bf16_t* ph = reinterpret_cast<const bf16_t*>(&hi);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    x[e] = __bfloat162float(pl[e]);
    y[e] = __bfloat162float(ph[e]);
  }
  rotate_chunk_values(x, y, w, interleaved, false);
  uint32_t* wl = reinterpret_cast<uint32_t*>(&lo);
  uint32_t* wh = reinterpret_cast<uint32_t*>(&hi);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    wl[m] = pack_bf16(x[2 * m], x[2 * m + 1]);
    wh[m] = pack_bf16(y[2 * m], y[2 * m + 1]);
  }
}

// The RoPE angles of the chunks this thread copies with copy_tile_async
// (rows r0...), by cp.async into their slots of `slots` (kRows * 4 slots),
// in the same group as the tile: the thread's own wait covers them, so the
// rotation after it needs no barrier and no global read. Rows past `limit`
// are not rotated and get none.
template <int kRows, int kThreads>
__device__ __forceinline__ void copy_angles_async(float* slots, const Block& r, int64_t r0,
                                                  int64_t limit, const FlashArgs& a) {
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    const int64_t i = r0 + row;
    if (i >= limit) continue;
    const AngleRows angles = angle_rows(a, r.first + i);
    const int k0 = chunk_pair(0, c, a.interleaved), k1 = chunk_pair(4, c, a.interleaved);
    float* slot = slots + item * kAngleSlot;
    cp_async<16>(slot, angles.cos + k0);
    cp_async<16>(slot + 4, angles.cos + k1);
    cp_async<16>(slot + 8, angles.sin + k0);
    cp_async<16>(slot + 12, angles.sin + k1);
  }
}

// Rotates the chunks of a shared tile that this thread copied with
// copy_tile_async (rows r0... below `limit`), once its wait has covered them,
// by angles_of(item, row, c): the chunk's eight angles.
template <int kRows, int kThreads, class Layout, class AnglesOf>
__device__ __forceinline__ void rotate_own_chunks_with(bf16_t* s, int64_t r0, int64_t limit,
                                                       bool interleaved, AnglesOf angles_of) {
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    if (r0 + row >= limit) continue;
    uint4* lo = reinterpret_cast<uint4*>(s + Layout::chunk(row, c));
    uint4* hi = reinterpret_cast<uint4*>(s + Layout::chunk(row, c + 4));
    uint4 x = *lo, y = *hi;
    rotate_chunks(x, y, angles_of(item, row, c), interleaved);
    *lo = x;
    *hi = y;
  }
}

// ... by the angles copy_angles_async staged in `slots` (its wait covers
// both).
template <int kRows, int kThreads, class Layout = PaddedTile>
__device__ __forceinline__ void rotate_own_chunks(bf16_t* s, const float* slots, int64_t r0,
                                                  int64_t limit, bool interleaved) {
  rotate_own_chunks_with<kRows, kThreads, Layout>(
      s, r0, limit, interleaved,
      [slots](int item, int, int) { return angles_from_slot(slots + item * kAngleSlot); });
}

// ... by angles read from the table in global memory (the key tiles of the
// key-tile kernel, which has no room for angle slots).
template <int kRows, int kThreads, class Layout = PaddedTile>
__device__ __forceinline__ void rotate_own_chunks_by_table(bf16_t* s, const Block& r, int64_t r0,
                                                           int64_t limit, const FlashArgs& a) {
  rotate_own_chunks_with<kRows, kThreads, Layout>(
      s, r0, limit, a.interleaved,
      [&](int, int row, int c) { return angles_from_table(a, r.first + r0 + row, c); });
}

// Floats of shared memory a StreamedPair's angle slots take (two buffers).
constexpr size_t kAngleFloats = size_t(2) * kInnerTile * 4 * kAngleSlot;

// The slots of buffer `buffer` (one query tile's rows) in `angles`.
__device__ __forceinline__ float* buffer_angle_slots(float* angles, int buffer) {
  return angles + buffer * kInnerTile * 4 * kAngleSlot;
}

// Shared bytes of the streamed tiles' RoPE angles: none unless tiles are
// rotated as they load. The gradients' rotation reads the table, except
// the wgmma backward's for dq: that kernel reserves the slots whenever
// there is a table.
constexpr size_t kAngleBytes = kAngleFloats * sizeof(float);
inline size_t angle_bytes(const FlashArgs& a) {
  return a.rotate_loads ? kAngleBytes : 0;
}

}  // namespace

}  // namespace roformer::kernels::cuda

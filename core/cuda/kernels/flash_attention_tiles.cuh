// The tiles of the tensor-core attention kernels (flash_attention.cu: the
// forward; flash_attention_backward.cu: the backward): a block's own rows
// loaded once, tiles streamed through two shared buffers by cp.async
// (StreamedPair), accumulators written out (rotated back under RoPE), the key
// biases of masked tiles, and the shared-memory budget the layouts must fit.
// What they build on: flash_attention_args.cuh (arguments, rows),
// flash_attention_mma.cuh (instructions), flash_attention_rope.cuh.
#pragma once

#include "core/cuda/kernels/flash_attention_rope.cuh"

namespace roformer::kernels::cuda {

namespace {

// Rows [r0, r0 + kRows) of a bf16 operand copied to a shared tile (the
// block's own rows, loaded once), rotated by the RoPE table when `rotate`.
// Each thread moves chunk c of a row: every RoPE pair of either layout lies
// within what one thread holds. Rows past `limit` are zeros.
template <int kRows, int kThreads = kThreadsPerBlock, class Layout = PaddedTile>
__device__ __forceinline__ void load_tile(bf16_t* s, const Operand& o, const Block& r, int64_t r0,
                                          int64_t limit, const FlashArgs& a, bool rotate) {
  static_assert(kRows * 4 % kThreads == 0, "a tile's row chunks split evenly over the block");
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    const int64_t i = r0 + row;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (i < limit) {
      const bf16_t* p = row_of<const bf16_t>(o, r, i);
      lo = *reinterpret_cast<const uint4*>(p + 8 * c);
      hi = *reinterpret_cast<const uint4*>(p + 8 * c + 32);
      if (rotate) rotate_chunks(lo, hi, angles_from_table(a, r.first + i, c), a.interleaved);
    }
    *reinterpret_cast<uint4*>(s + Layout::chunk(row, c)) = lo;
    *reinterpret_cast<uint4*>(s + Layout::chunk(row, c + 4)) = hi;
  }
}

// Rows [r0, r0 + kRows) of a bf16 operand copied to a shared tile by
// cp.async, split over kThreads threads as load_tile splits them (the chunks
// rotate_own_chunks rotates); rows past `limit` are zeros, stored at once.
template <int kRows, int kThreads, class Layout = PaddedTile>
__device__ __forceinline__ void copy_tile_async(bf16_t* s, const RowStream& rows, int64_t r0,
                                                int64_t limit) {
  const RowStream o = rows;  // one shared load: cp.async's memory clobber would reload it per row
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    const int64_t i = r0 + row;
    bf16_t* lo = s + Layout::chunk(row, c);
    bf16_t* hi = s + Layout::chunk(row, c + 4);
    if (i < limit) {
      const bf16_t* p = o.row<const bf16_t>(i);
      cp_async<16>(lo, p + 8 * c);
      cp_async<16>(hi, p + 8 * c + 32);
    } else {
      *reinterpret_cast<uint4*>(lo) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(hi) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Two operands streamed tile by tile (K and V, or Q and dO), each through
// two shared buffers of kInnerTile rows: tile n lives in buffer n % 2. With
// `angles` (RoPE), the first operand is rotated as each tile arrives, by
// angles copied with the tile into two buffers of slots. Layout places the
// tiles' chunks (PaddedTile for mma.sync, SwizzledTile for wgmma).
template <int kThreads, class Layout = PaddedTile>
struct StreamedPair {
  bf16_t* shared0;
  bf16_t* shared1;
  const RowStream& operand0;  // in shared memory (RowStream)
  const RowStream& operand1;
  float* angles = nullptr;  // kAngleFloats, or null: no rotation

  __device__ bf16_t* first(int buffer) const {
    return shared0 + buffer * kInnerTile * Layout::kRowStride;
  }
  __device__ bf16_t* second(int buffer) const {
    return shared1 + buffer * kInnerTile * Layout::kRowStride;
  }
  __device__ float* slots(int buffer) const { return buffer_angle_slots(angles, buffer); }
  // Queues (without committing) the copies of the first operand's tile at
  // rows r0 into `buffer`, with its angles; nothing when r0 is past `limit`.
  __device__ void queue_first(int buffer, const Block& r, int64_t r0, int64_t limit,
                              const FlashArgs& a) const {
    if (r0 >= limit) return;
    copy_tile_async<kInnerTile, kThreads, Layout>(first(buffer), operand0, r0, limit);
    if (angles) copy_angles_async<kInnerTile, kThreads>(slots(buffer), r, r0, limit, a);
  }
  // ... of the second operand's tile.
  __device__ void queue_second(int buffer, int64_t r0, int64_t limit) const {
    if (r0 < limit)
      copy_tile_async<kInnerTile, kThreads, Layout>(second(buffer), operand1, r0, limit);
  }
  // Once this thread's wait covers the first operand's tile at rows r0 in
  // `buffer`: rotates the chunks it copied, when there are angles.
  __device__ void rotate_first(int buffer, int64_t r0, int64_t limit, const FlashArgs& a) const {
    if (angles)
      rotate_own_chunks<kInnerTile, kThreads, Layout>(first(buffer), slots(buffer), r0, limit,
                                                      a.interleaved);
  }
  // Queues the copies of the tile at rows r0 into `buffer` (and its angles)
  // and commits them as one group (an empty one when r0 is past `limit`), so
  // a wait for all but the newest group always covers the tile before. Both
  // tiles, then the angles: queue_first and queue_second would put the angles
  // between them, which moved ptxas's schedule of the mma.sync forward (16
  // instructions more a tile with dropout).
  __device__ void fetch(int buffer, const Block& r, int64_t r0, int64_t limit,
                        const FlashArgs& a) const {
    if (r0 < limit) {
      copy_tile_async<kInnerTile, kThreads, Layout>(first(buffer), operand0, r0, limit);
      copy_tile_async<kInnerTile, kThreads, Layout>(second(buffer), operand1, r0, limit);
      if (angles) copy_angles_async<kInnerTile, kThreads>(slots(buffer), r, r0, limit, a);
    }
    cp_async_commit();
  }
  // The tile at rows r0 is in `buffer`: queues the next one into the other
  // buffer, waits for this thread's copies of this one, and rotates its
  // chunks of the first operand when there are angles. A barrier must come
  // before other threads read the tile.
  __device__ void arrive(int buffer, const Block& r, int64_t r0, int64_t limit,
                         const FlashArgs& a) const {
    arrive_before(buffer, r, r0, r0 + kInnerTile, limit, a);
  }
  // arrive, with the tile to queue at rows `next` (past `limit`: none), for
  // loops that do not walk the rows upwards.
  __device__ void arrive_before(int buffer, const Block& r, int64_t r0, int64_t next, int64_t limit,
                                const FlashArgs& a) const {
    fetch(buffer ^ 1, r, next, limit, a);
    cp_async_wait<1>();  // this tile's copies have landed, the next tile's may not
    rotate_first(buffer, r0, limit, a);
  }
};

// Writes kN 8-wide column tiles of a 16-row accumulator (rows row0 + g,
// row0 + g + 8; local tile n is the operand's column tile tile_of(n)) to a
// gradient or output operand (its rows: OperandRows or StreamRows), scaled
// per row, rotated back by the RoPE table when `unrotate` (the gradient of
// the unrotated input). Rotating needs each pair whole: in the half layout
// tile n's partner (32 columns on) must be local tile n + kN / 2. The
// angles come from `row_slots` with kFromSlots (the slots copy_angles_async
// staged for rows row0..., read after a barrier), else from the table in
// global memory (a load the store waits on).
template <bool kFromSlots = false, int kN, class TileOf, class Rows>
__device__ __forceinline__ void store_row_tiles(const float (&c)[kN][4], TileOf tile_of,
                                                const Rows& rows, DType dtype, const Block& r,
                                                int64_t row0, int64_t limit,
                                                const float (&row_scale)[2], const FlashArgs& a,
                                                bool unrotate, int g, int t,
                                                const float* row_slots = nullptr) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t i = row0 + g + 8 * hf;
    if (i >= limit) continue;
    float x[kN][2];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      x[n][0] = c[n][2 * hf] * row_scale[hf];
      x[n][1] = c[n][2 * hf + 1] * row_scale[hf];
    }
    if (unrotate) {
      const int64_t pos = r.first + i;
      // Pair k's cosine and sine at this row.
      const auto angle = [&](int k) {
        if constexpr (kFromSlots) {
          return slot_angle(row_slots, g + 8 * hf, k, a.interleaved);
        } else {
          const AngleRows table = angle_rows(a, pos);
          return make_float2(table.cos[k], table.sin[k]);
        }
      };
      if (a.interleaved) {
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          const float2 w = angle(tile_of(n) * 4 + t);
          rotate_pair(x[n][0], x[n][1], w.x, -w.y);
        }
      } else {
#pragma unroll
        for (int n = 0; n < kN / 2; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float2 w = angle(tile_of(n) * 8 + 2 * t + e);
            rotate_pair(x[n][e], x[n + kN / 2][e], w.x, -w.y);
          }
      }
    }
    // A thread's two columns (an even one and the next) by one store where
    // the row allows it (outputs may be views with any alignment).
    if (dtype == DType::f32) {
      float* p = rows.template row<float>(i);
      const bool pairs = reinterpret_cast<uintptr_t>(p) % sizeof(float2) == 0;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        float* q = p + tile_of(n) * 8 + 2 * t;
        if (pairs) {
          *reinterpret_cast<float2*>(q) = make_float2(x[n][0], x[n][1]);
        } else {
          q[0] = x[n][0];
          q[1] = x[n][1];
        }
      }
    } else {
      bf16_t* p = rows.template row<bf16_t>(i);
      const bool pairs = reinterpret_cast<uintptr_t>(p) % sizeof(uint32_t) == 0;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        bf16_t* q = p + tile_of(n) * 8 + 2 * t;
        if (pairs) {
          *reinterpret_cast<uint32_t*>(q) = pack_bf16(x[n][0], x[n][1]);
        } else {
          q[0] = __float2bfloat16_rn(x[n][0]);
          q[1] = __float2bfloat16_rn(x[n][1]);
        }
      }
    }
  }
}

// Writes a 16 x 64 accumulator's rows (row0 + g, row0 + g + 8): store_row_tiles
// of all eight column tiles.
__device__ __forceinline__ void store_rows(const float (&c)[8][4], const Operand& o, DType dtype,
                                           const Block& r, int64_t row0, int64_t limit,
                                           const float (&row_scale)[2], const FlashArgs& a,
                                           bool unrotate, int g, int t) {
  store_row_tiles(
      c, [](int n) { return n; }, OperandRows{o, r}, dtype, r, row0, limit, row_scale, a, unrotate,
      g, t);
}

// Additive bias of key j: 0, or -inf for a masked key or one past the end.
__device__ __forceinline__ float key_bias(const FlashArgs& a, const Block& r, int64_t j) {
  if (j >= r.Lk) return -INFINITY;
  if (!a.varlen && !key_kept(a.mask, r.b, j)) return -INFINITY;
  return 0.0f;
}

// Whether the key tile of `keys` keys at j0 has a key to leave out (one past
// the end, or a padded batch's mask): only such tiles need the key biases.
__device__ __forceinline__ bool key_tile_masked(const FlashArgs& a, const Block& r, int64_t j0,
                                                int64_t keys = kInnerTile) {
  return j0 + keys > r.Lk || (!a.varlen && a.mask.defined());
}

// Adds the key biases of a 64-key tile (sBias, from key_tile_ready) to a
// warp's 16 x 64 scores: column 8 nt + 2t + (e & 1) of each row.
__device__ __forceinline__ void add_key_biases(float (&s)[8][4], const float* bias, int t) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] += bias[nt * 8 + 2 * t + (e & 1)];
}

// The key biases of the 64-key tile at j0 into `bias` (threads 0..63, one
// each), in a tile with a key to leave out: the others read none.
__device__ __forceinline__ void stage_key_biases(float* bias, const FlashArgs& a, const Block& r,
                                                 int64_t j0) {
  if (threadIdx.x < kInnerTile && key_tile_masked(a, r, j0))
    bias[threadIdx.x] = key_bias(a, r, j0 + threadIdx.x);
}

// Key tile j0 (K and V in `buffer` of kv) made ready for the whole block:
// this thread's copies landed and its K chunks rotated, the tile's key biases
// in sBias (a tile with a key to leave out: the others read none), then a
// barrier. The forward and the dq pass open each key tile so.
template <int kThreads, class Layout>
__device__ __forceinline__ void key_tile_ready(const StreamedPair<kThreads, Layout>& kv, int buffer,
                                               const Block& r, int64_t j0, const FlashArgs& a,
                                               float* sBias) {
  kv.arrive(buffer, r, j0, r.Lk, a);
  if constexpr (Layout::kReadByWgmma) fence_shared_for_wgmma();
  stage_key_biases(sBias, a, r, j0);
  __syncthreads();  // every thread's copies, rotations and biases are visible
}

// Two blocks an SM (the forward, and the dq pass's default) must fit the
// H100's 228 KB of shared memory an SM, 1 KB of it reserved per block, with
// RoPE's angles too: a larger layout would silently halve the warps an SM.
constexpr size_t kSharedPerSm = 228 * 1024, kReservedPerBlock = 1024;
// The static shared memory of a kernel's RowStreams, at most.
constexpr size_t kStreamBytes = 8 * sizeof(RowStream);

}  // namespace

}  // namespace roformer::kernels::cuda

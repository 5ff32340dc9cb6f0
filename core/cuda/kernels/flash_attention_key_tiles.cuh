// What the fused backward's key-tile kernels (the mma.sync one in
// flash_attention_backward.cu, the wgmma one in
// flash_attention_backward_wgmma.cu) stage besides the Q and dO tiles: each
// query row's lse, D and keep words, and the split's running dq sums.
#pragma once

#include "core/cuda/kernels/flash_attention_tiles.cuh"

namespace roformer::kernels::cuda {

namespace {

// What the key-tile kernel reads of each query row of a tile besides Q and
// dO: lse, D and the keep words of the block's 128 keys, in two buffers like
// the tiles. fetch queues them by cp.async (4-byte copies: token-stream rows
// are H floats apart) into the open copy group, so the wait that covers a
// tile covers its row data: no global load's latency before each tile's
// barrier.
struct QueryRowData {
  float* base;  // [2][kInnerTile] lse, [2][kInnerTile] D, [2][kInnerTile][4] keep words
  static_assert(kThreadsPerBlock == 4 * kInnerTile, "a thread per keep word of a tile");

  __device__ float* lse(int buffer) const { return base + buffer * kInnerTile; }
  __device__ float* delta(int buffer) const { return base + (2 + buffer) * kInnerTile; }
  __device__ uint32_t* bits(int buffer) const {
    return reinterpret_cast<uint32_t*>(base + 4 * kInnerTile) + buffer * 4 * kInnerTile;
  }
  __device__ float* end() const { return base + 12 * kInnerTile; }

  // After this thread's wait: the lse it copied in log2 units (+inf for a
  // row with no key, lse -inf, or past the end: its probabilities then come
  // out 0 with no test per element), the D it copied times the softmax
  // scale. Each element is its copier's, so no barrier comes before; the
  // one after the wait publishes them.
  __device__ void prepare(int buffer, float scale) const {
    const int tid = threadIdx.x;
    if (tid < kInnerTile) {
      float& x = lse(buffer)[tid];
      x = x == -INFINITY ? INFINITY : x * kLog2e;
    } else if (tid < 2 * kInnerTile) {
      delta(buffer)[tid - kInnerTile] *= scale;
    }
  }

  // Rows i0... into `buffer` (lse, D and the keep words from their
  // RowStreams): thread t < 64 copies row t's lse, 64 <= t < 128 row t - 64's
  // D, and thread t keep word t % 4 of row t / 4. Rows past Lq (and words
  // past a row's end) get -inf, 0 and 0 by plain stores, seen after the
  // barrier that follows the wait.
  __device__ void fetch(int buffer, const RowStream& lse_rows, const RowStream& delta_rows,
                        const RowStream& bits_rows, int64_t Lq, int64_t i0, int64_t first_word,
                        int64_t row_words, bool keep_words) const {
    const int tid = threadIdx.x;
    if (tid < 2 * kInnerTile) {
      const bool is_delta = tid >= kInnerTile;
      const int row = tid % kInnerTile;
      const int64_t i = i0 + row;
      float* d = (is_delta ? delta(buffer) : lse(buffer)) + row;
      const RowStream from = is_delta ? delta_rows : lse_rows;
      if (i < Lq)
        cp_async<4>(d, from.row<const float>(i));
      else
        *d = is_delta ? 0.0f : -INFINITY;
    }
    if (keep_words) {
      const int qi = tid >> 2, w = tid & 3;
      const int64_t i = i0 + qi;
      uint32_t* d = bits(buffer) + tid;
      if (i < Lq && first_word + w < row_words)
        cp_async<4>(d, bits_rows.row<const uint32_t>(i) + first_word + w);
      else
        *d = 0u;
    }
  }
};

// Floats a row of a staged dq partial tile takes in shared memory: a quad's
// float2 reads (rows g..g + 3 of a half warp, 72 floats apart) fall in
// distinct banks.
constexpr int kAccLd = kD + 8;

// The running dq sums of query tiles, staged into two shared buffers of
// kInnerTile x kAccLd floats by cp.async with the tiles (the fused kernel
// adds a key tile's dQ to them): the wait that covers a Q tile covers its
// sums.
struct DqPartialTiles {
  float* base;
  static_assert(kInnerTile * 16 % kThreadsPerBlock == 0, "a tile's 16-byte chunks split evenly");

  __device__ float* tile(int buffer) const { return base + buffer * kInnerTile * kAccLd; }
  __device__ float* end() const { return base + 2 * kInnerTile * kAccLd; }

  // Rows i0... of `slice` into `buffer`; rows past Lq are not read (in a
  // token stream they are another sequence's).
  __device__ void fetch(int buffer, const RowStream& slice_rows, int64_t Lq, int64_t i0) const {
    const RowStream slice = slice_rows;  // one shared load for the block's rows
#pragma unroll
    for (int n = 0; n < kInnerTile * 16 / kThreadsPerBlock; ++n) {
      const int item = threadIdx.x + n * kThreadsPerBlock;
      const int row = item >> 4, c = item & 15;
      if (i0 + row < Lq)
        cp_async<16>(tile(buffer) + row * kAccLd + 4 * c, slice.row<const float>(i0 + row) + 4 * c);
    }
  }
};

// The rows a key-tile kernel's loops copy (RowStream), in the shared table
// its thread 0 fills (fill_key_tile_streams) before a barrier.
enum KeyTileStream {
  kStreamK,
  kStreamV,
  kStreamQ,
  kStreamO,
  kStreamLse,
  kStreamDelta,
  kStreamBits,
  kStreamSums,
  kKeyTileStreams
};
static_assert(kKeyTileStreams * sizeof(RowStream) <= kStreamBytes, "kStreamBytes too small");

// This block's split's running dq sums: its slice of the scratch, or none
// (null) when the host sized the grid for one key tile a sequence: then a
// longer sequence (a longest_segment understated by the caller) is summed
// wrong, never written out of bounds.
__device__ __forceinline__ Operand split_slice(const DqPartials& partials, const Block& r) {
  Operand slice = partials.rows;
  if (slice.ptr) slice.ptr = static_cast<float*>(slice.ptr) + r.tile * partials.split_stride;
  return slice;
}

template <bool kDropout>
__device__ __forceinline__ void fill_key_tile_streams(RowStream (&streams)[kKeyTileStreams],
                                                      const FlashArgs& a, const Block& r,
                                                      const Operand& slice) {
  streams[kStreamK] = row_stream<const bf16_t>(a.k, r);
  streams[kStreamV] = row_stream<const bf16_t>(a.v, r);
  streams[kStreamQ] = row_stream<const bf16_t>(a.q, r);
  streams[kStreamO] = row_stream<const bf16_t>(a.grad_out, r);
  streams[kStreamLse] = row_stream<const float>(a.lse, r);
  streams[kStreamDelta] = row_stream<const float>(a.delta, r);
  streams[kStreamBits] = kDropout ? row_stream<const uint32_t>(a.bits, r) : RowStream{nullptr, 0};
  streams[kStreamSums] = slice.ptr ? row_stream<float>(slice, r) : RowStream{nullptr, 0};
}

// This thread's two keys' biases (rows key0 + g, + 8: 0, or -inf for a key
// masked or past the end), which set those keys' P to 0 only in a key tile
// with such a key (`masked`).
__device__ __forceinline__ void key_biases_of(float (&bias)[2], const FlashArgs& a, const Block& r,
                                              int64_t key0, bool masked, int g) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) bias[hf] = masked ? key_bias(a, r, key0 + g + 8 * hf) : 0.0f;
}

// A warp's S^T and dP^T for a query tile (rows: keys key0 + g, + 8 of the
// block's; columns: the tile's 64 queries, 8 nt + 2 t (+ 1)) become P^T (with
// dropout's keep bits applied; its 1 / (1 - p) is dV's to take once, at its
// store: dropout_gain) and dS^T = P (dP z - D) scale, the scale inside:
// P (dP z scale - D scale). In a tile with a key to leave out (`masked`),
// those keys get P = 0, by a select after the exponents. sLse2, sDScaled and
// sBits: the tile's row data (QueryRowData, prepared). In two steps, so that
// the first may run while dP^T is still being computed:
// key_tile_exponents turns S^T into P^T before dropout, key_tile_gradients
// then applies dropout to it and makes dS^T of dP^T.
__device__ __forceinline__ void key_tile_exponents(float (&st)[8][4], bool masked,
                                                   const float (&key_bias_of)[2],
                                                   const float* sLse2, const FlashArgs& a, int t) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      st[nt][e] = exp2_approx(fmaf(st[nt][e], a.scale_log2, -sLse2[nt * 8 + 2 * t + (e & 1)]));
  // A key left out (bias -inf) gets P = 0, as exp2 of its biased score
  // would give; taken after the exponents, so that the branch follows them.
  if (masked) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (key_bias_of[e >> 1] != 0.0f) st[nt][e] = 0.0f;
  }
}
template <bool kDropout>
__device__ __forceinline__ void key_tile_gradients(float (&pt)[8][4], float (&dpt)[8][4],
                                                   const float* sDScaled, const uint32_t* sBits,
                                                   const FlashArgs& a, int key0, int g, int t) {
  // Keys key0 + g and key0 + g + 8 share a keep word (key0 a multiple of
  // 16): one load a column for both.
  const uint32_t* words = sBits + ((key0 + g) >> 5);
  const int bit = (key0 + g) & 31;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = nt * 8 + 2 * t + c;
      const float dc = sDScaled[col];
      const uint32_t word = kDropout ? words[col * 4] : 0u;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int e = 2 * hf + c;
        const float p = pt[nt][e];
        if constexpr (kDropout) {
          const bool kept = (word >> (bit + 8 * hf)) & 1u;
          pt[nt][e] = kept ? p : 0.0f;
          dpt[nt][e] = p * fmaf(dpt[nt][e], kept ? a.inv_keep * a.scale : 0.0f, -dc);
        } else {
          dpt[nt][e] = p * fmaf(dpt[nt][e], a.scale, -dc);
        }
      }
    }
  }
}
template <bool kDropout>
__device__ __forceinline__ void key_tile_probabilities(float (&st)[8][4], float (&dpt)[8][4],
                                                       bool masked, const float (&key_bias_of)[2],
                                                       const float* sLse2, const float* sDScaled,
                                                       const uint32_t* sBits, const FlashArgs& a,
                                                       int key0, int g, int t) {
  key_tile_exponents(st, masked, key_bias_of, sLse2, a, t);
  key_tile_gradients<kDropout>(st, dpt, sDScaled, sBits, a, key0, g, t);
}

// Shared bytes of QueryRowData's two buffers.
constexpr size_t kRowDataShared = 12 * kInnerTile * sizeof(float);

}  // namespace

}  // namespace roformer::kernels::cuda

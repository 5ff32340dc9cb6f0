// The backward of the tensor-core attention (the forward and the scheme:
// flash_attention.cu; the building blocks: flash_attention_tiles.cuh and
// the headers it includes).
//
// D = dO . O per query row comes first (flash_delta_kernel). Then one of two
// schemes (flash_backward_passes chooses; dk and dv are the same bits in
// both):
// - fused (the default): a block owns 128 keys at a time and streams the
//   query tiles past them, computing S and dP once for five products (S, dP,
//   dV += P^T dO, dK += dS^T Q, dQ += dS K). dQ is summed in f32 across key
//   tiles without atomics: the grid splits each sequence's key tiles over
//   `splits` blocks, and each split adds into its own slice of a scratch
//   buffer by a plain load-add-store (each element has one owning thread, the
//   key tiles come in order); flash_dq_finalize_kernel sums the slices in a
//   fixed order. With one split the last key tile writes dq itself.
// - two passes: dq per 128 query rows over the key tiles (flash_dq_kernel),
//   then dk/dv per 128 keys (the fused kernel without dQ): S and dP are
//   computed twice, seven products.
// Either way the bits are the same on every run of the same shapes on the
// same GPU (the fused dq's summation order follows the split count, which
// follows the SM count).
#include <atomic>

#include "core/cuda/kernels/flash_attention_key_tiles.cuh"
#include "core/cuda/kernels/flash_backward_splits.h"

namespace roformer::kernels::cuda {

namespace {

// --- D = dO . O ---------------------------------------------------------------------

// Eight consecutive values of a bf16 or f32 row at p, as floats: by 16-byte
// loads where p is aligned (out may be any strided view; dO's rows are
// aligned, flash_supported checks).
__device__ __forceinline__ void load_eight(float (&x)[8], const void* p, DType dtype) {
  const bool vector = reinterpret_cast<uintptr_t>(p) % 16 == 0;
  if (dtype == DType::f32) {
    const float* f = static_cast<const float*>(p);
    if (vector) {
      const float4 u = reinterpret_cast<const float4*>(f)[0],
                   w = reinterpret_cast<const float4*>(f)[1];
      x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w;
      x[4] = w.x, x[5] = w.y, x[6] = w.z, x[7] = w.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = f[e];
    }
  } else {
    const bf16_t* h = static_cast<const bf16_t*>(p);
    if (vector) {
      const uint4 u = *reinterpret_cast<const uint4*>(h);
      const bf16_t* w = reinterpret_cast<const bf16_t*>(&u);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = __bfloat162float(w[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = __bfloat162float(h[e]);
    }
  }
}

// Eight values stored as bf16 or f32 at p: by one 16-byte store (two for
// f32) where p is aligned.
__device__ __forceinline__ void store_eight(void* p, DType dtype, const float (&x)[8]) {
  const bool vector = reinterpret_cast<uintptr_t>(p) % 16 == 0;
  if (dtype == DType::f32) {
    float* f = static_cast<float*>(p);
    if (vector) {
      reinterpret_cast<float4*>(f)[0] = make_float4(x[0], x[1], x[2], x[3]);
      reinterpret_cast<float4*>(f)[1] = make_float4(x[4], x[5], x[6], x[7]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = x[e];
    }
  } else {
    bf16_t* h = static_cast<bf16_t*>(p);
    if (vector) {
      *reinterpret_cast<uint4*>(h) = make_uint4(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]),
                                                pack_bf16(x[4], x[5]), pack_bf16(x[6], x[7]));
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = __float2bfloat16_rn(x[e]);
    }
  }
}

// Element `col` of row i of an operand of `dtype` (f32 or bf16).
__device__ __forceinline__ void* element_of(const Operand& o, DType dtype, const Block& r,
                                            int64_t i, int col) {
  if (dtype == DType::f32) return row_of<float>(o, r, i) + col;
  return row_of<bf16_t>(o, r, i) + col;
}

// D = dO . O for 128 query rows: a row's four chunks (dims 8c... and
// 8c + 32...) are a quad's four lanes, summed by shuffles.
__global__ void __launch_bounds__(kThreadsPerBlock) flash_delta_kernel(FlashArgs a, int64_t tiles) {
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq) return;
#pragma unroll
  for (int n = 0; n < kRowsPerBlock * 4 / kThreadsPerBlock; ++n) {
    const int item = threadIdx.x + n * kThreadsPerBlock;
    const int64_t i = i0 + (item >> 2);
    const int c = item & 3;
    float partial = 0.0f;
    if (i < r.Lq) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = 8 * c + 32 * half;
        float d[8], o[8];
        load_eight(d, element_of(a.grad_out, DType::bf16, r, i, col), DType::bf16);
        load_eight(o, element_of(a.out, a.out_dtype, r, i, col), a.out_dtype);
#pragma unroll
        for (int e = 0; e < 8; ++e) partial += d[e] * o[e];
      }
    }
    const float delta = quad_sum(partial);  // every lane takes part, rows past Lq with 0
    if (c == 0 && i < r.Lq) *row_of<float>(a.delta, r, i) = delta;
  }
}

// --- the two-pass scheme's dq pass ------------------------------------------------------

// dq for 128 query rows over all key tiles.
// kBlocksPerSm 1: Q's and dO's fragments stay in registers; 2: they are
// read from shared memory for each key tile, which fits the kernel in 128
// registers (no spills, ptxas sm_90) so two blocks share an SM -- 16 warps
// to hide each other's latency, for 8 more ldmatrix a warp per tile
// (flash_dq_blocks_per_sm chooses; the same bits either way). kDropout:
// compiled with and without dropout, as the forward, so a run without it
// issues none of the keep bits' instructions (predicated off, they still
// take issue slots).
template <int kBlocksPerSm, bool kDropout>
__global__ void __launch_bounds__(kThreadsPerBlock, kBlocksPerSm)
    flash_dq_kernel(FlashArgs a, int64_t tiles) {
  RF_DYNAMIC_SHARED(smem);
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sO = sQ + kRowsPerBlock * kLd;  // dO
  bf16_t* sK = sO + kRowsPerBlock * kLd;  // two tiles of kInnerTile rows
  bf16_t* sV = sK + 2 * kInnerTile * kLd;
  float* sBias = reinterpret_cast<float*>(sV + 2 * kInnerTile * kLd);
  float* sAngles = sBias + kInnerTile;   // kAngleFloats, with RoPE only
  enum { kK, kV, kBits, kStreamCount };  // the rows of what the loop reads (RowStream)
  __shared__ RowStream streams[kStreamCount];
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq) return;
  const bool rotate_loads = a.rotate_loads;
  const bool rotate_grads = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  if (threadIdx.x == 0) {
    streams[kK] = row_stream<const bf16_t>(a.k, r);
    streams[kV] = row_stream<const bf16_t>(a.v, r);
    if (kDropout) streams[kBits] = row_stream<const uint32_t>(a.bits, r);
  }
  __syncthreads();
  // K and V tiles by cp.async into two buffers, as in the forward.
  const StreamedPair<kThreadsPerBlock> kv{sK, sV, streams[kK], streams[kV],
                                          rotate_loads ? sAngles : nullptr};
  kv.fetch(0, r, 0, r.Lk, a);
  load_tile<kRowsPerBlock>(sQ, a.q, r, i0, r.Lq, a, rotate_loads);
  load_tile<kRowsPerBlock>(sO, a.grad_out, r, i0, r.Lq, a, false);
  __syncthreads();
  // One 16-row tile per warp; with two blocks an SM the fragments are read
  // from shared memory at each key tile instead.
  [[maybe_unused]] uint32_t qa[1][4][4], da[1][4][4];
  if constexpr (kBlocksPerSm == 1) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      load_a(qa[0][ks], sQ, warp * 16, ks * 16, lane);
      load_a(da[0][ks], sO, warp * 16, ks * 16, lane);
    }
  }
  const int64_t row0 = i0 + warp * 16;
  float Ds[2], lse2[2];  // D times the softmax scale; lse in log2 units
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t i = row0 + g + 8 * hf;
    Ds[hf] = i < r.Lq ? *row_of<const float>(a.delta, r, i) * a.scale : 0.0f;
    // A row with no key (lse -inf, or past the end) gets +inf: its
    // probabilities come out 0 without a test per element.
    const float lse = i < r.Lq ? *row_of<const float>(a.lse, r, i) : -INFINITY;
    lse2[hf] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
  float dq[1][8][4] = {};
  int buffer = 0;
  for (int64_t j0 = 0; j0 < r.Lk; j0 += kInnerTile, buffer ^= 1) {
    bf16_t* k_tile = kv.first(buffer);
    bf16_t* v_tile = kv.second(buffer);
    key_tile_ready(kv, buffer, r, j0, a, sBias);
    const bool masked = key_tile_masked(a, r, j0);
    // The keep words are loaded before the products, so their latency
    // overlaps the tensor-core work rather than following it.
    uint32_t bits[2][2] = {{0u, 0u}, {0u, 0u}};
    if constexpr (kDropout) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int64_t i = row0 + g + 8 * hf;
        const int64_t row_words = (r.Lk + 31) / 32;
#pragma unroll
        for (int w = 0; w < 2; ++w)
          if (i < r.Lq && j0 / 32 + w < row_words)
            bits[hf][w] = streams[kBits].template row<const uint32_t>(i)[j0 / 32 + w];
      }
    }
    float s[1][8][4], dp[1][8][4];
    if constexpr (kBlocksPerSm == 1) {
      mma_rows(s, qa, k_tile, lane);
      mma_rows(dp, da, v_tile, lane);
    } else {
      mma_rows_shared_a(s, sQ, warp * 16, k_tile, lane);
      mma_rows_shared_a(dp, sO, warp * 16, v_tile, lane);
    }
    if (masked) add_key_biases(s[0], sBias, t);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1, col = nt * 8 + 2 * t + (e & 1);
        const float p = exp2_approx(fmaf(s[0][nt][e], a.scale_log2, -lse2[hf]));
        // dS = P (dP z - D) scale, with the scale inside: P (dP z scale - D scale).
        const float zs =
            kDropout ? (((bits[hf][col >> 5] >> (col & 31)) & 1u) ? a.inv_keep * a.scale : 0.0f)
                     : a.scale;
        s[0][nt][e] = p * fmaf(dp[0][nt][e], zs, -Ds[hf]);
      }
    mma_accumulator_tile(dq, s, k_tile, lane);
    __syncthreads();  // this buffer's readers are done before it is refilled
  }
  cp_async_wait<0>();  // a guard, as in the forward: nothing is in flight here
  const float one[2] = {1.0f, 1.0f};
  store_rows(dq[0], a.dq, a.grad_dtype, r, row0, r.Lq, one, a, rotate_grads, g, t);
}

// --- the key-tile kernel: dk, dv (and, fused, dq) ------------------------------------------

// dk and dv for 128 key rows (8 warps x 16), queries in tiles of 64; the
// block takes key tiles tile, tile + tiles, ... of its sequence (the grid's
// `tiles` blocks a sequence). K and V come by cp.async with the first query
// tile (rotated by their owners after its wait); with kDq a key tile after
// the first comes early, copied into a second pair of buffers while the
// tile before it starts. kDq (the fused scheme): each query tile's dS is
// also staged in shared memory and dQ = dS K computed by the 8 warps as 4 x 2
// (16 query rows x 4 column tiles each), added to the split's running sums.
template <bool kDq, bool kDropout>
__global__ void __launch_bounds__(kThreadsPerBlock)
    flash_key_tile_kernel(FlashArgs a, int64_t tiles, DqPartials partials) {
  RF_DYNAMIC_SHARED(smem);
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sV = sK + kRowsPerBlock * kLd;
  bf16_t* sQ = sV + kRowsPerBlock * kLd;    // two tiles of kInnerTile rows
  bf16_t* sO = sQ + 2 * kInnerTile * kLd;   // dO, two tiles
  bf16_t* sDs = sO + 2 * kInnerTile * kLd;  // dS^T [keys][queries] (kDq only)
  const DqPartialTiles sums{reinterpret_cast<float*>(sDs + (kDq ? kRowsPerBlock * kLd : 0))};
  const QueryRowData rows{kDq ? sums.end() : sums.base};  // two buffers
  // The next key tile's K and V (kDq only), then RoPE's angle slots.
  bf16_t* sK2 = reinterpret_cast<bf16_t*>(rows.end());
  bf16_t* sV2 = sK2 + kRowsPerBlock * kLd;
  float* sAngles = kDq ? reinterpret_cast<float*>(sV2 + kRowsPerBlock * kLd) : rows.end();
  const Block r = block_of(a, tiles);
  const bool rotate_loads = a.rotate_loads;
  const bool rotate_grads = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;  // dQ's warp layout: rows 16 wm, column tiles wn + 2 n
  const auto dq_tile_of = [wn](int n) { return wn + 2 * n; };
  const Operand slice = split_slice(partials, r);
  const bool sums_kept = slice.ptr != nullptr;
  const int64_t row_words = (r.Lk + 31) / 32;
  __shared__ RowStream streams[kKeyTileStreams];
  if (threadIdx.x == 0) fill_key_tile_streams<kDropout>(streams, a, r, slice);
  __syncthreads();
  const StreamedPair<kThreadsPerBlock> qo{sQ, sO, streams[kStreamQ], streams[kStreamO],
                                          rotate_loads ? sAngles : nullptr};
  bf16_t *k_tile = sK, *v_tile = sV, *next_k = sK2, *next_v = sV2;
  for (int64_t kt = r.tile; kt * kRowsPerBlock < r.Lk; kt += tiles) {
    const int64_t j0 = kt * kRowsPerBlock, first_word = j0 / 32;
    const bool first = kt == r.tile || !sums_kept;              // no sums to add to yet
    const bool last = (kt + tiles) * kRowsPerBlock >= r.Lk;     // the block's last key tile
    const bool dq_final = kDq && last && partials.splits == 1;  // the sums are dq itself
    // Copied while the tile before ran (its first query tile issued them).
    const bool came_early = kDq && kt != r.tile && r.Lq > 0;
    // Q and dO tiles by cp.async into two buffers, as in the forward; the
    // row data (and the running sums, and K and V unless they came early)
    // join the first tile's group.
    if (r.Lq > 0) {
      rows.fetch(0, streams[kStreamLse], streams[kStreamDelta], streams[kStreamBits], r.Lq, 0,
                 first_word, row_words, kDropout);
      if (kDq && !first) sums.fetch(0, streams[kStreamSums], r.Lq, 0);
    }
    if (!came_early) {
      copy_tile_async<kRowsPerBlock, kThreadsPerBlock>(k_tile, streams[kStreamK], j0, r.Lk);
      copy_tile_async<kRowsPerBlock, kThreadsPerBlock>(v_tile, streams[kStreamV], j0, r.Lk);
    }
    qo.fetch(0, r, 0, r.Lq, a);
    // This thread's two keys' biases (0, or -inf: masked or past the end),
    // which set those keys' P to 0 only in a key tile with such a key.
    const int64_t key0 = j0 + warp * 16;
    const bool masked = key_tile_masked(a, r, j0, kRowsPerBlock);
    float key_bias_of[2];
    key_biases_of(key_bias_of, a, r, key0, masked, g);
    float dk[1][8][4] = {}, dv[1][8][4] = {};
    int buffer = 0;
    for (int64_t i0 = 0; i0 < r.Lq; i0 += kInnerTile, buffer ^= 1) {
      bf16_t* q_tile = qo.first(buffer);
      bf16_t* o_tile = qo.second(buffer);
      // The next tile's row data and sums join the group arrive commits with
      // its Q and dO.
      if (i0 + kInnerTile < r.Lq) {
        rows.fetch(buffer ^ 1, streams[kStreamLse], streams[kStreamDelta], streams[kStreamBits],
                   r.Lq, i0 + kInnerTile, first_word, row_words, kDropout);
        if (kDq && !first) sums.fetch(buffer ^ 1, streams[kStreamSums], r.Lq, i0 + kInnerTile);
      }
      // The block's next key tile, early: its copies join the group of query
      // tile 1, so the wait before tile 1 (or the next key tile's first)
      // covers them, a query tile's work after they were issued.
      if (kDq && i0 == 0 && !last) {
        const int64_t j_next = j0 + tiles * kRowsPerBlock;
        copy_tile_async<kRowsPerBlock, kThreadsPerBlock>(next_k, streams[kStreamK], j_next, r.Lk);
        copy_tile_async<kRowsPerBlock, kThreadsPerBlock>(next_v, streams[kStreamV], j_next, r.Lk);
      }
      qo.arrive(buffer, r, i0, r.Lq, a);
      // This key tile's K and V have landed (at this wait, or earlier when
      // they came early): this thread rotates the K chunks it copied.
      if (i0 == 0 && rotate_loads)
        rotate_own_chunks_by_table<kRowsPerBlock, kThreadsPerBlock>(k_tile, r, j0, r.Lk, a);
      rows.prepare(buffer, a.scale);
      const float* sLse2 = rows.lse(buffer);       // log2 units, +inf for rows with no key
      const float* sDScaled = rows.delta(buffer);  // D times the scale
      const uint32_t* sBits = rows.bits(buffer);
      __syncthreads();  // copies, rotations and row data visible (and K, V the first time)
      float st[1][8][4], dpt[1][8][4];  // S^T and dP^T: rows keys, columns queries
      {
        uint32_t ka[1][4][4];  // read from the shared tile each step: registers are short here
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) load_a(ka[0][ks], k_tile, warp * 16, ks * 16, lane);
        mma_rows(st, ka, q_tile, lane);
      }
      {
        uint32_t va[1][4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) load_a(va[0][ks], v_tile, warp * 16, ks * 16, lane);
        mma_rows(dpt, va, o_tile, lane);
      }
      key_tile_probabilities<kDropout>(st[0], dpt[0], masked, key_bias_of, sLse2, sDScaled, sBits,
                                       a, warp * 16, g, t);
      if constexpr (kDq) {
        // dS^T rounded to bf16 as the dK product rounds it: row key, pairs of
        // query columns (a quad's stores fall in distinct banks).
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            *reinterpret_cast<uint32_t*>(sDs + (warp * 16 + g + 8 * hf) * kLd + nt * 8 + 2 * t) =
                pack_bf16(dpt[0][nt][2 * hf], dpt[0][nt][2 * hf + 1]);
      }
      mma_accumulator_tile(dv, st, o_tile, lane);
      mma_accumulator_tile(dk, dpt, q_tile, lane);
      if constexpr (kDq) {
        __syncthreads();  // every warp's dS^T rows are in sDs
        // dQ of query rows 16 wm... , column tiles wn + 2 n: the sum over the
        // block's 128 keys of dS K, K as B[key][dim] = k_tile[key][dim].
        float acc[4][4] = {};
#pragma unroll
        for (int ks = 0; ks < kRowsPerBlock / 16; ++ks) {
          uint32_t afrag[4];
          load_a_trans(afrag, sDs, wm * 16, ks * 16, lane);
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            uint32_t b[4];
            load_b_trans_tiles(b, k_tile, ks * 16, dq_tile_of(2 * np) * 8,
                               dq_tile_of(2 * np + 1) * 8, lane);
            mma(acc[2 * np], afrag, b[0], b[1]);
            mma(acc[2 * np + 1], afrag, b[2], b[3]);
          }
        }
        if (!first) {  // add the sums of the split's earlier key tiles
          const float* staged = sums.tile(buffer);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int row = wm * 16 + g + 8 * hf;
            if (i0 + row >= r.Lq) continue;
#pragma unroll
            for (int n = 0; n < 4; ++n) {
              const float2 s = *reinterpret_cast<const float2*>(staged + row * kAccLd +
                                                                dq_tile_of(n) * 8 + 2 * t);
              acc[n][2 * hf] += s.x;
              acc[n][2 * hf + 1] += s.y;
            }
          }
        }
        const float one[2] = {1.0f, 1.0f};
        if (dq_final)
          store_row_tiles(acc, dq_tile_of, OperandRows{a.dq, r}, a.grad_dtype, r, i0 + wm * 16,
                          r.Lq, one, a, rotate_grads, g, t);
        else if (sums_kept)
          store_row_tiles(acc, dq_tile_of, StreamRows{streams[kStreamSums]}, DType::f32, r,
                          i0 + wm * 16, r.Lq, one, a, false, g, t);
      }
      __syncthreads();  // this buffer's, the row data's (and sDs's) readers are done
    }
    const float one[2] = {1.0f, 1.0f};
    store_rows(dk[0], a.dk, a.grad_dtype, r, key0, r.Lk, one, a, rotate_grads, g, t);
    const float dv_scale[2] = {dropout_gain<kDropout>(a), dropout_gain<kDropout>(a)};
    store_rows(dv[0], a.dv, a.grad_dtype, r, key0, r.Lk, dv_scale, a, false, g, t);
    if constexpr (kDq) {  // the early copies' buffers hold the next key tile
      bf16_t* const k_done = k_tile;
      bf16_t* const v_done = v_tile;
      k_tile = next_k, v_tile = next_v;
      next_k = k_done, next_v = v_done;
    }
  }
  cp_async_wait<0>();  // a guard, as in the forward: nothing is in flight here
}

// dq of 128 query rows from the splits' running sums (those of splits that
// had a key tile of the sequence; none: zeros), rotated back by the RoPE
// table and written in the gradients' dtype. A thread takes a row's dims
// [8c, 8c + 8) and [8c + 32, 8c + 40): whole RoPE pairs in either layout.
__global__ void __launch_bounds__(kThreadsPerBlock)
    flash_dq_finalize_kernel(FlashArgs a, int64_t tiles, DqPartials partials) {
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq) return;
  const int64_t key_tiles = (r.Lk + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t used = partials.splits < key_tiles ? partials.splits : key_tiles;
#pragma unroll
  for (int n = 0; n < kRowsPerBlock * 4 / kThreadsPerBlock; ++n) {
    const int item = threadIdx.x + n * kThreadsPerBlock;
    const int64_t i = i0 + (item >> 2);
    const int c = item & 3;
    if (i >= r.Lq) continue;
    float x[8] = {}, y[8] = {};
    for (int64_t s = 0; s < used; ++s) {
      const float* p = row_of<const float>(partials.rows, r, i) + s * partials.split_stride;
      float u[8], w[8];
      load_eight(u, p + 8 * c, DType::f32);
      load_eight(w, p + 8 * c + 32, DType::f32);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        x[e] += u[e];
        y[e] += w[e];
      }
    }
    if (a.table)
      rotate_chunk_values(x, y, angles_from_table(a, r.first + i, c), a.interleaved, true);
    store_eight(element_of(a.dq, a.grad_dtype, r, i, 8 * c), a.grad_dtype, x);
    store_eight(element_of(a.dq, a.grad_dtype, r, i, 8 * c + 32), a.grad_dtype, y);
  }
}

// Each kernel's dynamic shared memory before the angles (the layouts at the
// top of the kernels); two dq blocks an SM must fit.
constexpr size_t kDqShared = size_t(2 * (kRowsPerBlock + 2 * kInnerTile) * kLd) * sizeof(bf16_t) +
                             kInnerTile * sizeof(float);
constexpr size_t kDkvShared =
    size_t(2 * (kRowsPerBlock + 2 * kInnerTile) * kLd) * sizeof(bf16_t) + kRowDataShared;
constexpr size_t kFusedShared = kDkvShared + size_t(3 * kRowsPerBlock * kLd) * sizeof(bf16_t) +
                                size_t(2 * kInnerTile * kAccLd) * sizeof(float);
static_assert(2 * (kDqShared + kAngleBytes + kStreamBytes + kReservedPerBlock) <= kSharedPerSm,
              "two dq blocks no longer fit an SM");
static_assert(kFusedShared + kAngleBytes + kStreamBytes + kReservedPerBlock <= kSharedPerSm,
              "the fused backward no longer fits an SM");

// The process-wide choices (flash_attention.h).
std::atomic<int> dq_blocks_per_sm{2};
std::atomic<int> backward_passes{1};
std::atomic<int> backward_splits{0};
std::atomic<bool> backward_wgmma{true};
std::atomic<bool> alternate_sweeps{false};

int multiprocessor_count(const Stream& stream) {
  int count = 0;
  RF_CUDA_CHECK(
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, stream.device_index));
  return count;
}

// The fused scheme's split count (flash_backward_splits.h): the set count,
// capped by the key tiles, or the automatic one.
int64_t split_count(const Stream& stream, const BackwardSplitProblem& problem) {
  const int64_t set = backward_splits.load(std::memory_order_relaxed);
  if (set > 0) return std::min(set, std::max<int64_t>(problem.key_tiles, 1));
  BackwardSplitProblem p = problem;
  p.sms = multiprocessor_count(stream);
  return auto_backward_splits(p);
}

}  // namespace

int flash_dq_blocks_per_sm() {
  return dq_blocks_per_sm.load();
}

void set_flash_dq_blocks_per_sm(int blocks) {
  RF_CHECK(blocks == 1 || blocks == 2,
           "flash attention: the dq pass runs 1 or 2 blocks an SM, got ", blocks);
  dq_blocks_per_sm.store(blocks);
}

int flash_backward_passes() {
  return backward_passes.load();
}

void set_flash_backward_passes(int passes) {
  RF_CHECK(passes == 1 || passes == 2,
           "flash attention: the backward runs in 1 (fused) or 2 passes, got ", passes);
  backward_passes.store(passes);
}

bool flash_backward_uses_wgmma() {
  return backward_wgmma.load();
}

void set_flash_backward_uses_wgmma(bool on) {
  backward_wgmma.store(on);
}

bool flash_backward_alternates_sweeps() {
  return alternate_sweeps.load();
}

void set_flash_backward_alternates_sweeps(bool on) {
  alternate_sweeps.store(on);
}

int flash_backward_splits() {
  return backward_splits.load();
}

void set_flash_backward_splits(int splits) {
  RF_CHECK(splits >= 0 && splits <= 64,
           "flash attention: backward splits must be 0 (automatic) to 64, got ", splits);
  backward_splits.store(splits);
}

void flash_backward(Stream stream, const AttentionParams& params, const FlashRope& rope,
                    const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                    const KernelTensor& key_mask, const KernelTensor& segments,
                    const KernelTensor& out, const KernelTensor& lse, const KernelTensor& keep_bits,
                    const KernelTensor& grad_out, const KernelTensor& grad_q,
                    const KernelTensor& grad_k, const KernelTensor& grad_v) {
  RF_CHECK(flash_supported(q, k, v, grad_out), "flash attention: operands not supported");
  RF_CHECK((out.dtype == DType::f32 || out.dtype == DType::bf16) &&
               (grad_q.dtype == DType::f32 || grad_q.dtype == DType::bf16) &&
               grad_k.dtype == grad_q.dtype && grad_v.dtype == grad_q.dtype,
           "flash attention: out and the gradients must be f32 or bf16 (one dtype)");
  FlashArgs a = make_args(params, rope, q, k, v, key_mask, segments, out, lse, keep_bits);
  a.grad_out = operand_of(grad_out);
  check_row_streams(grad_out, "grad_out");
  a.dq = operand_of(grad_q);
  a.dk = operand_of(grad_k);
  a.dv = operand_of(grad_v);
  a.grad_dtype = grad_q.dtype;
  const int64_t heads = q.sizes[1];  // [B, H, S, D] and [T, H, D] alike
  if (heads == 0) return;
  // D = dO . O per query row, laid out like lse. With no query rows (Sq = 0)
  // there is none, but the key-tile kernel still runs: it writes the zero dk, dv.
  Scratch delta(stream, size_t(std::max<int64_t>(lse.numel(), 1)) * sizeof(float));
  const KernelTensor delta_t = contiguous_like(lse, delta.as<void>(), DType::f32);
  a.delta = lse_operand(delta_t);
  const Grid gq = grid_of(params, q, k, segments, false);
  const Grid gk = grid_of(params, q, k, segments, true);
  const bool queries = gq.sequences * gq.tiles > 0, keys = gk.sequences * gk.tiles > 0;
  if (queries)
    RF_LAUNCH(flash_delta_kernel, launch_grid(gq, heads), kThreadsPerBlock, 0, native(stream), a,
              gq.tiles);
  const size_t angles = angle_bytes(a);

  if (backward_passes.load(std::memory_order_relaxed) == 2) {
    if (queries) {
      const size_t shared = kDqShared + angles;
      const bool two = dq_blocks_per_sm.load(std::memory_order_relaxed) == 2;
      const auto kernel = a.drop.on ? (two ? flash_dq_kernel<2, true> : flash_dq_kernel<1, true>)
                                    : (two ? flash_dq_kernel<2, false> : flash_dq_kernel<1, false>);
      allow_shared(kernel, shared);
      RF_LAUNCH(kernel, launch_grid(gq, heads), kThreadsPerBlock, shared, native(stream), a,
                gq.tiles);
    }
    if (keys) {
      const size_t shared = kDkvShared + angles;
      const auto kernel =
          a.drop.on ? flash_key_tile_kernel<false, true> : flash_key_tile_kernel<false, false>;
      allow_shared(kernel, shared);
      RF_LAUNCH(kernel, launch_grid(gk, heads), kThreadsPerBlock, shared, native(stream), a,
                gk.tiles, DqPartials{});
    }
    return;
  }

  // Fused: one split's blocks take every key tile of their sequences; the
  // sums need a slice per split unless each block's one key tile is all.
  const int64_t rows = q.ndim == 4 ? q.sizes[0] * q.sizes[2] : q.sizes[0];
  const int64_t slice_floats = rows * heads * kD;
  BackwardSplitProblem split_problem;
  split_problem.per_split = gk.sequences * heads;
  split_problem.key_tiles = gk.tiles;
  // A token stream without its longest length (the op always gives it)
  // keeps the first rule: its key tiles and rows would be the whole stream's.
  split_problem.query_rows =
      q.ndim == 4 ? q.sizes[2] : std::max<int64_t>(params.longest_segment, 0);
  split_problem.dq_elements = slice_floats;
  const int64_t splits = split_count(stream, split_problem);
  const bool finalize = splits > 1 || !keys;
  const bool sums = keys && queries && (splits > 1 || gk.tiles > 1);
  Scratch partial(stream, sums ? size_t(splits * slice_floats) * sizeof(float) : 1);
  void* const sums_base = sums ? partial.as<void>() : nullptr;
  DqPartials partials;
  partials.splits = splits;
  partials.split_stride = slice_floats;
  if (q.ndim == 4)
    partials.rows = {sums_base, q.sizes[2] * heads * kD, kD, heads * kD};
  else
    partials.rows = {sums_base, 0, kD, heads * kD};
  if (keys && backward_wgmma.load(std::memory_order_relaxed) &&
      flash_wgmma_available(stream.device_index)) {
    launch_key_tiles_wgmma(stream, a, launch_grid(Grid{gk.sequences, splits}, heads), splits,
                           partials, alternate_sweeps.load(std::memory_order_relaxed));
  } else if (keys) {
    const size_t shared = kFusedShared + angles;
    const auto kernel =
        a.drop.on ? flash_key_tile_kernel<true, true> : flash_key_tile_kernel<true, false>;
    allow_shared(kernel, shared);
    RF_LAUNCH(kernel, launch_grid(Grid{gk.sequences, splits}, heads), kThreadsPerBlock, shared,
              native(stream), a, splits, partials);
  }
  if (finalize && queries)
    RF_LAUNCH(flash_dq_finalize_kernel, launch_grid(gq, heads), kThreadsPerBlock, 0, native(stream),
              a, gq.tiles, partials);
}

}  // namespace roformer::kernels::cuda

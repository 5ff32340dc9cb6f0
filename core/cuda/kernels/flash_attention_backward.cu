// The backward of the tensor-core attention (the forward and the scheme:
// flash_attention.cu; the building blocks: flash_attention_tiles.cuh).
#include <atomic>

#include "core/cuda/kernels/flash_attention_tiles.cuh"

namespace roformer::kernels::cuda {

namespace {

// Reads element (row, col) of the forward output (f32 or bf16).
__device__ __forceinline__ float out_at(const FlashArgs& a, const Block& r, int64_t i, int col) {
  if (a.out_dtype == DType::f32) return row_of<const float>(a.out, r, i)[col];
  return __bfloat162float(row_of<const bf16_t>(a.out, r, i)[col]);
}

// dq for 128 query rows, and D = dO . O of those rows (for the dk/dv pass).
// kBlocksPerSm 1: Q's and dO's fragments stay in registers (228 of them);
// 2: they are read from shared memory for each key tile, which fits the
// kernel in 128 registers (no spills, ptxas sm_90) so two blocks share an
// SM -- 16 warps to hide each other's latency, for 8 more ldmatrix a warp
// per tile (flash_dq_blocks_per_sm chooses; the same bits either way).
template <int kBlocksPerSm>
__global__ void __launch_bounds__(kThreadsPerBlock, kBlocksPerSm)
    flash_dq_kernel(FlashArgs a, int64_t tiles) {
  RF_DYNAMIC_SHARED(smem);
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sO = sQ + kRowsPerBlock * kLd;  // dO
  bf16_t* sK = sO + kRowsPerBlock * kLd;  // two tiles of kInnerTile rows
  bf16_t* sV = sK + 2 * kInnerTile * kLd;
  float* sBias = reinterpret_cast<float*>(sV + 2 * kInnerTile * kLd);
  float* sAngles = sBias + kInnerTile;  // kAngleFloats, with RoPE only
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq) return;
  const bool rope = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  // K and V tiles by cp.async into two buffers, as in the forward.
  const StreamedPair<kThreadsPerBlock> kv{sK, sV, a.k, a.v, rope ? sAngles : nullptr};
  kv.fetch(0, r, 0, r.Lk, a);
  load_tile<kRowsPerBlock>(sQ, a.q, r, i0, r.Lq, a, rope);
  load_tile<kRowsPerBlock>(sO, a.grad_out, r, i0, r.Lq, a, false);
  __syncthreads();
  // One 16-row tile per warp (with two blocks an SM, qa is not kept and da
  // serves D only).
  uint32_t qa[1][4][4], da[1][4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    if constexpr (kBlocksPerSm == 1) load_a(qa[0][ks], sQ, warp * 16, ks * 16, lane);
    load_a(da[0][ks], sO, warp * 16, ks * 16, lane);
  }
  const int64_t row0 = i0 + warp * 16;
  float Di[2], lse2[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t i = row0 + g + 8 * hf;
    float partial = 0.0f;
    if (i < r.Lq) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = ks * 16 + 8 * e + 2 * t;  // registers hf + 2 e hold these
          const __nv_bfloat162 d2 =
              *reinterpret_cast<const __nv_bfloat162*>(&da[0][ks][hf + 2 * e]);
          partial += __bfloat162float(d2.x) * out_at(a, r, i, col) +
                     __bfloat162float(d2.y) * out_at(a, r, i, col + 1);
        }
    }
    Di[hf] = quad_sum(partial);
    const float row_lse = i < r.Lq ? *row_of<const float>(a.lse, r, i) : -INFINITY;
    lse2[hf] = row_lse * kLog2e;
    if (t == 0 && i < r.Lq) *row_of<float>(a.delta, r, i) = Di[hf];
  }
  float dq[1][8][4] = {};
  int buffer = 0;
  for (int64_t j0 = 0; j0 < r.Lk; j0 += kInnerTile, buffer ^= 1) {
    bf16_t* k_tile = kv.first(buffer);
    bf16_t* v_tile = kv.second(buffer);
    key_tile_ready(kv, buffer, r, j0, a, sBias);
    // The keep words are loaded before the products, so their latency
    // overlaps the tensor-core work rather than following it.
    uint32_t bits[2][2] = {{0u, 0u}, {0u, 0u}};
    if (a.drop.on) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int64_t i = row0 + g + 8 * hf;
        const int64_t row_words = (r.Lk + 31) / 32;
#pragma unroll
        for (int w = 0; w < 2; ++w)
          if (i < r.Lq && j0 / 32 + w < row_words)
            bits[hf][w] = row_of<const uint32_t>(a.bits, r, i)[j0 / 32 + w];
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
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1, col = nt * 8 + 2 * t + (e & 1);
        float ds = 0.0f;
        if (lse2[hf] != -INFINITY) {
          const float p = exp2f(s[0][nt][e] * a.scale_log2 + sBias[col] - lse2[hf]);
          const float z =
              a.drop.on ? (((bits[hf][col >> 5] >> (col & 31)) & 1u) ? a.inv_keep : 0.0f) : 1.0f;
          ds = p * (dp[0][nt][e] * z - Di[hf]) * a.scale;
        }
        s[0][nt][e] = ds;
      }
    mma_accumulator_tile(dq, s, k_tile, lane);
    __syncthreads();  // this buffer's readers are done before it is refilled
  }
  cp_async_wait<0>();  // a guard, as in the forward: nothing is in flight here
  const float one[2] = {1.0f, 1.0f};
  store_rows(dq[0], a.dq, a.grad_dtype, r, row0, r.Lq, one, a, rope, g, t);
}

// What the dk/dv pass reads of each query row of a tile besides Q and dO:
// lse, D and the keep words of the block's 128 keys, in two buffers like the
// tiles. fetch queues them by cp.async (4-byte copies: token-stream rows are
// H floats apart) into the open copy group, so the wait that covers a tile
// covers its row data: no global load's latency before each tile's barrier.
struct QueryRowData {
  float* base;  // [2][kInnerTile] lse, [2][kInnerTile] D, [2][kInnerTile][4] keep words
  static_assert(kThreadsPerBlock == 4 * kInnerTile, "a thread per keep word of a tile");

  __device__ float* lse(int buffer) const { return base + buffer * kInnerTile; }
  __device__ float* delta(int buffer) const { return base + (2 + buffer) * kInnerTile; }
  __device__ uint32_t* bits(int buffer) const {
    return reinterpret_cast<uint32_t*>(base + 4 * kInnerTile) + buffer * 4 * kInnerTile;
  }
  __device__ float* end() const { return base + 12 * kInnerTile; }

  // Rows i0... into `buffer`: thread t < 64 copies row t's lse, 64 <= t < 128
  // row t - 64's D, and thread t keep word t % 4 of row t / 4. Rows past Lq
  // (and words past a row's end) get -inf, 0 and 0 by plain stores, seen
  // after the barrier that follows the wait.
  __device__ void fetch(int buffer, const FlashArgs& a, const Block& r, int64_t i0,
                        int64_t first_word, int64_t row_words) const {
    const int tid = threadIdx.x;
    if (tid < 2 * kInnerTile) {
      const bool is_delta = tid >= kInnerTile;
      const int row = tid % kInnerTile;
      const int64_t i = i0 + row;
      float* d = (is_delta ? delta(buffer) : lse(buffer)) + row;
      if (i < r.Lq)
        cp_async<4>(d, row_of<const float>(is_delta ? a.delta : a.lse, r, i));
      else
        *d = is_delta ? 0.0f : -INFINITY;
    }
    if (a.drop.on) {
      const int qi = tid >> 2, w = tid & 3;
      const int64_t i = i0 + qi;
      uint32_t* d = bits(buffer) + tid;
      if (i < r.Lq && first_word + w < row_words)
        cp_async<4>(d, row_of<const uint32_t>(a.bits, r, i) + first_word + w);
      else
        *d = 0u;
    }
  }
};

// dk and dv for 128 key rows (8 warps x 16), queries in tiles of 64.
__global__ void __launch_bounds__(kThreadsPerBlock) flash_dkv_kernel(FlashArgs a, int64_t tiles) {
  RF_DYNAMIC_SHARED(smem);
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sV = sK + kRowsPerBlock * kLd;
  bf16_t* sQ = sV + kRowsPerBlock * kLd;   // two tiles of kInnerTile rows
  bf16_t* sO = sQ + 2 * kInnerTile * kLd;  // dO, two tiles
  const QueryRowData rows{reinterpret_cast<float*>(sO + 2 * kInnerTile * kLd)};  // two buffers
  float* sAngles = rows.end();                                                   // with RoPE only
  const Block r = block_of(a, tiles);
  const int64_t j0 = r.tile * kRowsPerBlock;
  if (j0 >= r.Lk) return;
  const bool rope = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  // Q and dO tiles by cp.async into two buffers, as in the forward.
  const int64_t first_word = j0 / 32, row_words = (r.Lk + 31) / 32;
  const StreamedPair<kThreadsPerBlock> qo{sQ, sO, a.q, a.grad_out, rope ? sAngles : nullptr};
  if (r.Lq > 0) rows.fetch(0, a, r, 0, first_word, row_words);  // joins the first tile's group
  qo.fetch(0, r, 0, r.Lq, a);
  load_tile<kRowsPerBlock>(sK, a.k, r, j0, r.Lk, a, rope);
  load_tile<kRowsPerBlock>(sV, a.v, r, j0, r.Lk, a, false);
  const int64_t key0 = j0 + warp * 16;
  bool kept[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) kept[hf] = key_bias(a, r, key0 + g + 8 * hf) == 0.0f;
  float dk[1][8][4] = {}, dv[1][8][4] = {};
  int buffer = 0;
  for (int64_t i0 = 0; i0 < r.Lq; i0 += kInnerTile, buffer ^= 1) {
    bf16_t* q_tile = qo.first(buffer);
    bf16_t* o_tile = qo.second(buffer);
    // The next tile's row data joins the group arrive commits with its Q and dO.
    if (i0 + kInnerTile < r.Lq)
      rows.fetch(buffer ^ 1, a, r, i0 + kInnerTile, first_word, row_words);
    qo.arrive(buffer, r, i0, r.Lq, a);
    const float* sLse = rows.lse(buffer);
    const float* sDelta = rows.delta(buffer);
    const uint32_t* sBits = rows.bits(buffer);
    __syncthreads();  // copies, rotations and row data visible (and sK, sV the first time)
    float st[1][8][4], dpt[1][8][4];  // S^T and dP^T: rows keys, columns queries
    {
      uint32_t ka[1][4][4];  // read from the shared tile each step: registers are short here
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) load_a(ka[0][ks], sK, warp * 16, ks * 16, lane);
      mma_rows(st, ka, q_tile, lane);
    }
    {
      uint32_t va[1][4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) load_a(va[0][ks], sV, warp * 16, ks * 16, lane);
      mma_rows(dpt, va, o_tile, lane);
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1, col = nt * 8 + 2 * t + (e & 1);
        const int key = warp * 16 + g + 8 * hf;  // in the block's 128 keys
        float pz = 0.0f, ds = 0.0f;
        if (kept[hf] && sLse[col] != -INFINITY) {
          const float p = exp2f(st[0][nt][e] * a.scale_log2 - sLse[col] * kLog2e);
          const float z =
              a.drop.on ? (((sBits[col * 4 + (key >> 5)] >> (key & 31)) & 1u) ? a.inv_keep : 0.0f)
                        : 1.0f;
          pz = p * z;
          ds = p * (dpt[0][nt][e] * z - sDelta[col]) * a.scale;
        }
        st[0][nt][e] = pz;
        dpt[0][nt][e] = ds;
      }
    mma_accumulator_tile(dv, st, o_tile, lane);
    mma_accumulator_tile(dk, dpt, q_tile, lane);
    __syncthreads();  // this buffer's and the row data's readers are done
  }
  cp_async_wait<0>();  // a guard, as in the forward: nothing is in flight here
  const float one[2] = {1.0f, 1.0f};
  store_rows(dk[0], a.dk, a.grad_dtype, r, key0, r.Lk, one, a, rope, g, t);
  store_rows(dv[0], a.dv, a.grad_dtype, r, key0, r.Lk, one, a, false, g, t);
}

// Each pass's dynamic shared memory before the angles (the layouts at the
// top of the kernels); two dq blocks an SM must fit.
constexpr size_t kDqShared = size_t(2 * (kRowsPerBlock + 2 * kInnerTile) * kLd) * sizeof(bf16_t) +
                             kInnerTile * sizeof(float);
constexpr size_t kDkvShared = size_t(2 * (kRowsPerBlock + 2 * kInnerTile) * kLd) * sizeof(bf16_t) +
                              12 * kInnerTile * sizeof(float);
static_assert(2 * (kDqShared + kAngleBytes + kReservedPerBlock) <= kSharedPerSm,
              "two dq blocks no longer fit an SM");

// The dq pass's blocks an SM, process-wide (flash_dq_blocks_per_sm).
std::atomic<int> dq_blocks_per_sm{2};

}  // namespace

int flash_dq_blocks_per_sm() {
  return dq_blocks_per_sm.load();
}

void set_flash_dq_blocks_per_sm(int blocks) {
  RF_CHECK(blocks == 1 || blocks == 2,
           "flash attention: the dq pass runs 1 or 2 blocks an SM, got ", blocks);
  dq_blocks_per_sm.store(blocks);
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
  a.dq = operand_of(grad_q);
  a.dk = operand_of(grad_k);
  a.dv = operand_of(grad_v);
  a.grad_dtype = grad_q.dtype;
  const int64_t heads = q.sizes[1];  // [B, H, S, D] and [T, H, D] alike
  if (heads == 0) return;
  // D = dO . O per query row, laid out like lse. With no query rows (Sq = 0)
  // there is none, but the dk/dv pass still runs: it writes their zeros.
  Scratch delta(stream, size_t(std::max<int64_t>(lse.numel(), 1)) * sizeof(float));
  const KernelTensor delta_t = contiguous_like(lse, delta.as<void>(), DType::f32);
  a.delta = lse_operand(delta_t);
  const Grid gq = grid_of(params, q, k, segments, false);
  if (gq.sequences * gq.tiles > 0) {
    const size_t shared = kDqShared + angle_bytes(a);
    const auto kernel = dq_blocks_per_sm.load(std::memory_order_relaxed) == 2 ? flash_dq_kernel<2>
                                                                              : flash_dq_kernel<1>;
    allow_shared(kernel, shared);
    RF_LAUNCH(kernel, launch_grid(gq, heads), kThreadsPerBlock, shared, native(stream), a,
              gq.tiles);
  }
  const Grid gk = grid_of(params, q, k, segments, true);
  if (gk.sequences * gk.tiles > 0) {
    const size_t shared = kDkvShared + angle_bytes(a);
    allow_shared(flash_dkv_kernel, shared);
    RF_LAUNCH(flash_dkv_kernel, launch_grid(gk, heads), kThreadsPerBlock, shared, native(stream), a,
              gk.tiles);
  }
}

}  // namespace roformer::kernels::cuda
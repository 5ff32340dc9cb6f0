// The attention forward on Hopper's warpgroup products (wgmma, sm_90a; built
// for that architecture alone, core/cuda/CMakeLists.txt): the scheme of the
// mma.sync forward (flash_attention.cu) with its products moved off the
// warps' registers. A block owns 128 query rows as two warpgroups of 64;
// S = Q K^T reads Q and the key tile straight from shared memory, and
// O += P V takes P from registers and V from shared memory, so no ldmatrix
// feeds the tensor cores (the mma.sync forward's bound: each ldmatrix.x4
// serves two mma.sync). Tiles live in the 128-byte swizzle (SwizzledTile)
// that wgmma's descriptors read. Each warp holds its 16 rows in the mma.sync
// accumulator layout, so the online softmax, dropout and the stores are the
// mma.sync forward's own (flash_attention_forward.cuh); results agree with
// it to f32 rounding (the products may sum in another order), the keep bits
// exactly. The default on compute capability 9.0
// (set_flash_forward_uses_wgmma, flash_attention.h).
#include "core/cuda/kernels/flash_attention_forward.cuh"
#include "core/cuda/kernels/wgmma.cuh"

namespace roformer::kernels::cuda {

namespace {

template <bool kDropout>
__global__ void __launch_bounds__(kThreadsPerBlock, 2)
    flash_forward_wgmma_kernel(FlashArgs a, int64_t tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(ROFORMER_SIMT_EMULATION)
  RF_DYNAMIC_SHARED(smem);
  bf16_t* sQ = reinterpret_cast<bf16_t*>(swizzle_aligned(smem));
  bf16_t* sK = sQ + kRowsPerBlock * kD;  // two tiles of kInnerTile rows
  bf16_t* sV = sK + 2 * kInnerTile * kD;
  float* sBias = reinterpret_cast<float*>(sV + 2 * kInnerTile * kD);
  float* sAngles = sBias + kInnerTile;  // kAngleFloats, with RoPE only
  enum { kK, kV, kStreamCount };
  __shared__ RowStream streams[kStreamCount];
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq) return;  // the whole block: a shorter segment
  const bool rope = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  if (threadIdx.x == 0) {
    streams[kK] = row_stream<const bf16_t>(a.k, r);
    streams[kV] = row_stream<const bf16_t>(a.v, r);
  }
  __syncthreads();
  const StreamedPair<kThreadsPerBlock, SwizzledTile> kv{sK, sV, streams[kK], streams[kV],
                                                        rope ? sAngles : nullptr};
  kv.fetch(0, r, 0, r.Lk, a);
  load_tile<kRowsPerBlock, kThreadsPerBlock, SwizzledTile>(sQ, a.q, r, i0, r.Lq, a, rope);
  fence_shared_for_wgmma();  // the first key tile's barrier publishes Q to every warpgroup
  // This warpgroup's 64 query rows (a whole number of swizzle atoms).
  const bf16_t* q_rows = sQ + (warp / 4) * 64 * kD;
  const int64_t row0 = i0 + warp * 16;  // this warp's rows
  float o[8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  int buffer = 0;
  for (int64_t j0 = 0; j0 < r.Lk; j0 += kInnerTile, buffer ^= 1) {
    const bf16_t* k_tile = kv.first(buffer);
    const bf16_t* v_tile = kv.second(buffer);
    key_tile_ready(kv, buffer, r, j0, a, sBias);
    const bool masked = key_tile_masked(a, r, j0);
    float s[8][4];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_ss(s, k_major_step(q_rows, ks), k_major_step(k_tile, ks), ks > 0);
    wgmma_commit();
    // The keep bits depend on positions alone: their Philox rounds run on the
    // ALUs while the tensor cores compute the scores.
    uint32_t keep = 0u;
    if constexpr (kDropout) keep = keep_mask(a, r, row0, j0, g, t);
    wgmma_wait<0>();
    fence_accumulator(s);
    online_softmax_tile(s, o, m, l, sBias, masked, a.scale_log2, t);
    if constexpr (kDropout) dropout_tile(s, keep, a, r, row0, j0, g, t);
    uint32_t p[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) accumulator_as_a(p[kk], s, kk);
    fence_accumulator(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs(o, p[kk], n_major_step(v_tile, kk));
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulator(o);
    __syncthreads();  // this buffer's readers are done before it is refilled
  }
  cp_async_wait<0>();  // as the mma.sync forward: no path exits with copies in flight
  finish_forward_rows(o, m, l, dropout_gain<kDropout>(a), a, r, row0, g, t);
#else
  // Built without sm_90a's features (the object library's architecture
  // lost): a launch must fail loudly, not leave its outputs unwritten.
  (void)a;
  (void)tiles;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

// The dynamic shared memory before the angles, with room to align the tiles.
constexpr size_t kWgmmaForwardShared =
    kSwizzleAtom + size_t(kRowsPerBlock + 4 * kInnerTile) * kD * sizeof(bf16_t) +
    kInnerTile * sizeof(float);
static_assert(2 * (kWgmmaForwardShared + kAngleBytes + kStreamBytes + kReservedPerBlock) <=
                  kSharedPerSm,
              "two wgmma forward blocks no longer fit an SM");

}  // namespace

void flash_forward_wgmma(Stream stream, const AttentionParams& params, const FlashRope& rope,
                         const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                         const KernelTensor& key_mask, const KernelTensor& segments,
                         const KernelTensor& out, const KernelTensor& lse,
                         const KernelTensor& keep_bits) {
  RF_CHECK(flash_supported(q, k, v), "flash attention: operands not supported");
  RF_CHECK(flash_wgmma_available(stream.device_index), "flash attention: the wgmma forward needs ",
           "a GPU of compute capability 9.0 (device ", stream.device_index, " is not)");
  FlashArgs a = make_args(params, rope, q, k, v, key_mask, segments, out, lse, keep_bits);
  const int64_t heads = q.sizes[1];
  const Grid g = grid_of(params, q, k, segments, false);
  if (g.sequences * g.tiles == 0 || heads == 0) return;
  const auto kernel =
      a.drop.on ? flash_forward_wgmma_kernel<true> : flash_forward_wgmma_kernel<false>;
  const size_t shared = kWgmmaForwardShared + angle_bytes(a);
  allow_shared(kernel, shared);
  RF_LAUNCH(kernel, launch_grid(g, heads), kThreadsPerBlock, shared, native(stream), a, g.tiles);
}

}  // namespace roformer::kernels::cuda

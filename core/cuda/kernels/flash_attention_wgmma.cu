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
//
// Two schedules of the key tiles (set_flash_forward_schedule). In step:
// per tile, S, wait, softmax, O += P V, wait, and two barriers. Pipelined
// (FlashAttention-3's overlap within a warpgroup): tile j + 1's S is issued
// with tile j's P V, so the softmax of j + 1 runs while the tensor cores
// compute P V; K streams one tile ahead of V, so one barrier a tile covers
// both buffers (pipelined_key_tiles). Both compute every element the same
// way: the same bits.
#include "core/cuda/kernels/flash_attention_forward.cuh"
#include "core/cuda/kernels/wgmma.cuh"

namespace roformer::kernels::cuda {

namespace {

// One key tile's scores S = Q K^T for a warpgroup's 64 query rows, issued
// and committed (q_rows and k_tile whole swizzle atoms).
__device__ __forceinline__ void issue_scores(float (&s)[8][4], const bf16_t* q_rows,
                                             const bf16_t* k_tile) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    wgmma_ss(s, k_major_step(q_rows, ks), k_major_step(k_tile, ks), ks > 0);
  wgmma_commit();
}

// O += P V for a key tile, P from registers (as the products' A), issued and
// committed.
__device__ __forceinline__ void issue_output(float (&o)[8][4], const uint32_t (&p)[4][4],
                                             const bf16_t* v_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs(o, p[kk], n_major_step(v_tile, kk));
  wgmma_commit();
}

// The tile's probabilities (with dropout's zeros) as the A fragments of P V.
__device__ __forceinline__ void probabilities_as_a(uint32_t (&p)[4][4], const float (&s)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) accumulator_as_a(p[kk], s, kk);
}

// The block's tiles as they stream (K and V), its Q and this warp's place.
struct ForwardTiles {
  const StreamedPair<kThreadsPerBlock, SwizzledTile>& kv;
  const bf16_t* q_rows;   // this warpgroup's 64 query rows
  float* sBias;           // two buffers of kInnerTile key biases
  const RowStream& bits;  // the keep bits' rows (read when drawn ahead)
  int64_t row0;           // this warp's first query row
  int g, t;
};

// Where a tile's keep bits come from: drawn by the forward itself
// (keep_mask, then written by dropout_tile) or, kAhead, read from the bits a
// kernel of their own drew before it (flash_keep_bits_kernel), a tile's
// words loaded while the tile before is computed. Nothing without dropout.
template <bool kDropout, bool kAhead>
struct TileKeep {
  KeepWords next{};  // the next tile's words (kAhead)

  // Before the first tile: its words on their way.
  __device__ __forceinline__ void start(const ForwardTiles& x, const Block& r) {
    if constexpr (kDropout && kAhead) next = load_keep_words(x.bits, r, x.row0, 0, x.g);
  }
  // Key tile j0's keep bits (at keep_bit); with kAhead the tile after's
  // words are loaded meanwhile. Tiles come in order.
  __device__ __forceinline__ uint32_t take(const ForwardTiles& x, const FlashArgs& a,
                                           const Block& r, int64_t j0) {
    if constexpr (!kDropout) {
      return 0u;
    } else if constexpr (kAhead) {
      const KeepWords words = next;
      next = load_keep_words(x.bits, r, x.row0, j0 + kInnerTile, x.g);
      return keep_from_words(words, x.t);
    } else {
      return keep_mask(a, r, x.row0, j0, x.g, x.t);
    }
  }
  // Dropout's zeros on tile j0's probabilities, and its words written where
  // the forward drew them.
  __device__ __forceinline__ void apply(float (&p)[8][4], uint32_t keep, const ForwardTiles& x,
                                        const FlashArgs& a, const Block& r, int64_t j0) const {
    if constexpr (kDropout && kAhead)
      apply_keep(p, keep);
    else if constexpr (kDropout)
      dropout_tile(p, keep, a, r, x.row0, j0, x.g, x.t);
  }
};

// The in-step schedule: each key tile's S, softmax and P V in turn, K and V
// of the next tile in flight meanwhile.
template <bool kDropout, bool kAhead>
__device__ __forceinline__ void key_tiles_in_step(const ForwardTiles& x, const FlashArgs& a,
                                                  const Block& r, float (&o)[8][4], float (&m)[2],
                                                  float (&l)[2]) {
  TileKeep<kDropout, kAhead> drop;
  drop.start(x, r);
  int buffer = 0;
  for (int64_t j0 = 0; j0 < r.Lk; j0 += kInnerTile, buffer ^= 1) {
    key_tile_ready(x.kv, buffer, r, j0, a, x.sBias);
    const bool masked = key_tile_masked(a, r, j0);
    float s[8][4];
    issue_scores(s, x.q_rows, x.kv.first(buffer));
    // The keep bits depend on positions alone: drawn here, their Philox
    // rounds run on the ALUs while the tensor cores compute the scores (drawn
    // ahead, the next tile's words are loaded meanwhile).
    const uint32_t keep = drop.take(x, a, r, j0);
    wgmma_wait<0>();
    fence_accumulator(s);
    online_softmax_tile(s, o, m, l, x.sBias, masked, a.scale_log2, x.t);
    drop.apply(s, keep, x, a, r, j0);
    uint32_t p[4][4];
    probabilities_as_a(p, s);
    fence_accumulator(o);
    issue_output(o, p, x.kv.second(buffer));
    wgmma_wait<0>();
    fence_accumulator(o);
    __syncthreads();  // this buffer's readers are done before it is refilled
  }
}

// Key tile j0's probabilities from its scores (the online softmax, dropout
// and its keep bits) into P's A fragments; corr: what the output rows take
// to follow a moved max (1 where none moved).
template <bool kDropout, bool kAhead>
__device__ __forceinline__ void tile_probabilities(uint32_t (&p)[4][4], float (&corr)[2],
                                                   float (&s)[8][4], uint32_t keep,
                                                   const TileKeep<kDropout, kAhead>& drop,
                                                   const ForwardTiles& x, const float* bias,
                                                   const FlashArgs& a, const Block& r, int64_t j0,
                                                   float (&m)[2], float (&l)[2]) {
  softmax_tile_probabilities(s, m, l, corr, bias, key_tile_masked(a, r, j0), a.scale_log2, x.t);
  drop.apply(s, keep, x, a, r, j0);
  probabilities_as_a(p, s);
}

// This thread's copies of K tile j0 landed: rotated (under RoPE), the tile's
// key biases (if it has a key to leave out) in bias buffer `buffer`, then
// made visible to the block's products by the barrier that must follow.
__device__ __forceinline__ void key_tile_landed(const ForwardTiles& x, int buffer,
                                                const FlashArgs& a, const Block& r, int64_t j0) {
  x.kv.rotate_first(buffer, j0, r.Lk, a);
  fence_shared_for_wgmma();
  stage_key_biases(x.sBias + buffer * kInnerTile, a, r, j0);
}

// The top of a pipelined tile. The P V issued by the tile before has landed
// (none is in flight at the first); the output rows move to the running max
// of the tile whose probabilities are pending (corr: at the first tile, 0
// or 1 times rows of zeros; every tile, although most move no row's max,
// since ptxas serializes the products of a loop whose output rows are
// rescaled in a branch); those probabilities become the A fragments of the
// P V issued next. The wait heads the next tile rather than ending this
// one: there ptxas hoisted it above the softmax it was meant to overlap (up
// to the loop body's last branch, with or without the masked tiles' bias
// branch); it does not move it across the loop's back edge.
__device__ __forceinline__ void take_pending(float (&o)[8][4], uint32_t (&p)[4][4],
                                             const uint32_t (&pending)[4][4],
                                             const float (&corr)[2]) {
  wgmma_wait<0>();
  fence_accumulator(o);
  fence_fragments(p);
  rescale_rows(o, corr);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[kk][e] = copy_after_wait(pending[kk][e]);
}

// The pipelined schedule. K runs one tile ahead of V: the copy group queued
// at tile j holds K of j + 2 and V of j + 1, waited for at the top of
// tile j + 1, whose one barrier then also says that every warp is done with
// the buffers refilled next (K of j + 1's S completed at tile j, V of j's
// P V at the top of tile j + 1, before that barrier). Each tile issues the
// next tile's S and its own P V together, and computes the next tile's
// probabilities while P V runs (into a second set of registers, `pending`);
// the next tile waits for that P V before its barrier, then rescales the
// output rows (take_pending). The last tile's P V runs after the loop, so
// no product sits in a branch.
template <bool kDropout, bool kAhead>
__device__ __forceinline__ void pipelined_key_tiles(const ForwardTiles& x, const FlashArgs& a,
                                                    const Block& r, float (&o)[8][4], float (&m)[2],
                                                    float (&l)[2]) {
  TileKeep<kDropout, kAhead> drop;
  drop.start(x, r);
  // K of tile 0 alone, then K of tile 1 with V of tile 0.
  cp_async_wait<1>();
  key_tile_landed(x, 0, a, r, 0);
  __syncthreads();
  float s[8][4];
  issue_scores(s, x.q_rows, x.kv.first(0));
  uint32_t keep = drop.take(x, a, r, 0);
  wgmma_wait<0>();
  fence_accumulator(s);
  uint32_t pending[4][4];  // the probabilities of the tile whose P V comes next
  float corr[2];
  tile_probabilities(pending, corr, s, keep, drop, x, x.sBias, a, r, 0, m, l);
  uint32_t p[4][4] = {};  // P V's A fragments (zeros until the first take_pending)
  int buffer = 0;         // tile j's (K and V alike)
  for (int64_t j0 = 0; j0 + kInnerTile < r.Lk; j0 += kInnerTile, buffer ^= 1) {
    const int next = buffer ^ 1;
    const int64_t j1 = j0 + kInnerTile;
    take_pending(o, p, pending, corr);
    cp_async_wait<0>();  // K of j + 1, V of j
    key_tile_landed(x, next, a, r, j1);
    __syncthreads();
    x.kv.queue_first(buffer, r, j1 + kInnerTile, r.Lk, a);
    x.kv.queue_second(next, j1, r.Lk);
    cp_async_commit();
    // The next tile's keep bits, drawn (or gathered from words loaded a tile
    // ago) before the products are issued: while they run, their operands
    // hold the registers the Philox rounds need.
    keep = drop.take(x, a, r, j1);
    issue_scores(s, x.q_rows, x.kv.first(next));
    fence_accumulator(o);
    issue_output(o, p, x.kv.second(buffer));
    wgmma_wait<1>();  // the scores (the older group); P V may still run
    fence_accumulator(s);
    tile_probabilities(pending, corr, s, keep, drop, x, x.sBias + next * kInnerTile, a, r, j1, m,
                       l);
  }
  take_pending(o, p, pending, corr);
  // The last tile's V (queued with the K past the end, or at tile 0).
  cp_async_wait<0>();
  fence_shared_for_wgmma();
  __syncthreads();
  fence_accumulator(o);
  issue_output(o, p, x.kv.second(buffer));
  wgmma_wait<0>();
  fence_accumulator(o);
}

template <bool kDropout, bool kPipelined, bool kBitsAhead>
__global__ void __launch_bounds__(kThreadsPerBlock, 2)
    flash_forward_wgmma_kernel(FlashArgs a, int64_t tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(ROFORMER_SIMT_EMULATION)
  RF_DYNAMIC_SHARED(smem);
  bf16_t* sQ = reinterpret_cast<bf16_t*>(swizzle_aligned(smem));
  bf16_t* sK = sQ + kRowsPerBlock * kD;  // two tiles of kInnerTile rows
  bf16_t* sV = sK + 2 * kInnerTile * kD;
  float* sBias = reinterpret_cast<float*>(sV + 2 * kInnerTile * kD);  // two buffers
  float* sAngles = sBias + 2 * kInnerTile;  // kAngleFloats, with RoPE only
  enum { kK, kV, kBits, kStreamCount };
  __shared__ RowStream streams[kStreamCount];
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq) return;  // the whole block: a shorter segment
  const bool rope = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  if (threadIdx.x == 0) {
    streams[kK] = row_stream<const bf16_t>(a.k, r);
    streams[kV] = row_stream<const bf16_t>(a.v, r);
    if constexpr (kBitsAhead) streams[kBits] = row_stream<const uint32_t>(a.bits, r);
  }
  __syncthreads();
  const StreamedPair<kThreadsPerBlock, SwizzledTile> kv{sK, sV, streams[kK], streams[kV],
                                                        rope ? sAngles : nullptr};
  if constexpr (kPipelined) {
    kv.queue_first(0, r, 0, r.Lk, a);
    cp_async_commit();
  } else {
    kv.fetch(0, r, 0, r.Lk, a);
  }
  load_tile<kRowsPerBlock, kThreadsPerBlock, SwizzledTile>(sQ, a.q, r, i0, r.Lq, a, rope);
  fence_shared_for_wgmma();  // the first key tile's barrier publishes Q to every warpgroup
  if constexpr (kPipelined) {
    kv.queue_first(1, r, kInnerTile, r.Lk, a);
    kv.queue_second(0, 0, r.Lk);
    cp_async_commit();
  }
  // This warpgroup's 64 query rows (a whole number of swizzle atoms).
  const ForwardTiles x{
      kv, sQ + warpgroup_index() * 64 * kD, sBias, streams[kBits], i0 + warp * 16, g, t};
  float o[8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  if (r.Lk > 0) {
    if constexpr (kPipelined)
      pipelined_key_tiles<kDropout, kBitsAhead>(x, a, r, o, m, l);
    else
      key_tiles_in_step<kDropout, kBitsAhead>(x, a, r, o, m, l);
  }
  cp_async_wait<0>();  // as the mma.sync forward: no path exits with copies in flight
  finish_forward_rows(o, m, l, dropout_gain<kDropout>(a), a, r, x.row0, g, t);
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

// The forward kernel of a dropout setting under either schedule.
template <bool kDropout, bool kBitsAhead>
auto forward_kernel(bool pipelined) {
  return pipelined ? flash_forward_wgmma_kernel<kDropout, true, kBitsAhead>
                   : flash_forward_wgmma_kernel<kDropout, false, kBitsAhead>;
}

// The dynamic shared memory before the angles, with room to align the tiles.
constexpr size_t kWgmmaForwardShared =
    kSwizzleAtom + size_t(kRowsPerBlock + 4 * kInnerTile) * kD * sizeof(bf16_t) +
    2 * kInnerTile * sizeof(float);
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
  // The schedule timed faster for this forward (flash_forward_schedule).
  const ForwardSchedule schedule = flash_forward_schedule();
  const bool pipelined = schedule == ForwardSchedule::pipelined ||
                         (schedule == ForwardSchedule::automatic && a.table == nullptr);
  const dim3 grid = launch_grid(g, heads);
  // The keep bits drawn by a kernel of their own first (flash_keep_bits_ahead).
  const bool ahead = a.drop.on && flash_keep_bits_ahead();
  if (ahead) launch_keep_bits(stream, a, grid, g.tiles);
  const auto kernel = !a.drop.on ? forward_kernel<false, false>(pipelined)
                      : ahead    ? forward_kernel<true, true>(pipelined)
                                 : forward_kernel<true, false>(pipelined);
  const size_t shared = kWgmmaForwardShared + angle_bytes(a);
  allow_shared(kernel, shared);
  RF_LAUNCH(kernel, grid, kThreadsPerBlock, shared, native(stream), a, g.tiles);
}

}  // namespace roformer::kernels::cuda

// Tensor-core softmax attention for bf16 q, k, v at head dim 64 (the
// FlashAttention-2 scheme, written for this project). This file is the
// forward; flash_attention_backward.cu the backward; the building blocks both
// share: flash_attention_tiles.cuh (tiles, streaming, stores) on
// flash_attention_rope.cuh, flash_attention_mma.cuh and
// flash_attention_args.cuh.
// - forward: a block owns 128 query rows (8 warps x 16); key/value tiles of
//   64 rows pass through shared memory; S = Q K^T and O += P V run on
//   mma.sync m16n8k16 (bf16 in, f32 accumulation) with an online softmax in
//   base 2; the row log-sum-exp (natural log, as the CPU writes it) and, with
//   dropout, the keep bits of the shared Philox rule are written;
// - backward recomputes P from q, k and the log-sum-exp, with no float
//   atomics (the same bits on every run): see flash_attention_backward.cu;
// - RoPE inside: with a table, Q and K tiles are rotated as they are loaded
//   (either pair layout), and dq, dk are rotated back before they are written,
//   so they are the gradients of the unrotated q and k;
// - padded batches (key mask) and token streams (segments of (first token,
//   length, row, position)) share the kernels: a block works on one
//   sequence (a batch row or a segment), one head, one tile.
#include <atomic>

#include "core/cuda/kernels/flash_attention_tiles.cuh"

namespace roformer::kernels::cuda {

namespace {

// --- forward --------------------------------------------------------------------------

// The keep bits of a warp's 16 x 64 tile (keys j0...): bit hf * 16 + 2 nt + e
// is row g + 8 hf, key j0 + 8 nt + 2 t + e. A Philox block holds the draws
// of one row's 8-key tile, and its word t is lane t's two keys. The quad's
// four lanes share rows g and g + 8, so each lane draws four of the quad's
// sixteen blocks (tiles 2 t and 2 t + 1 of both rows) and hands each word to
// its owner by a shuffle within the quad. One block is drawn at a time: its
// ten rounds need few registers, and the eight warps of a block hide their
// latency. Keys past the end are cleared once, in a tile that has them.
__device__ __forceinline__ uint32_t keep_mask(const FlashArgs& a, const Block& r, int64_t row0,
                                              int64_t j0, int g, int t) {
  uint32_t keep = 0u;
#pragma unroll 1
  for (int q = 0; q < 4; ++q) {
    const int hf = q >> 1, c = q & 1;
    const uint32_t position = r.drop_position + uint32_t(row0 + g + 8 * hf);
    const int64_t first_key = j0 + (2 * t + c) * 8;  // j0 is a multiple of 64
    const PhiloxCounter w =
        philox4x32(dropout_block(uint32_t(first_key / kDropoutDrawsPerBlock), position,
                                 r.drop_sequence, a.drop.site, uint32_t(r.h)),
                   a.drop.key);
    // send[x] = word t ^ x, the one lane t ^ x owns: two layers of
    // conditional swaps rather than a select among four words per x.
    uint32_t send[4] = {w[0], w[1], w[2], w[3]};
    if (t & 1) {
      const uint32_t s0 = send[0], s2 = send[2];
      send[0] = send[1];
      send[1] = s0;
      send[2] = send[3];
      send[3] = s2;
    }
    if (t & 2) {
      const uint32_t s0 = send[0], s1 = send[1];
      send[0] = send[2];
      send[1] = send[3];
      send[2] = s0;
      send[3] = s1;
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      // This lane gets word t of lane (t ^ x)'s block: tile 2 (t ^ x) + c of row hf.
      const uint32_t got = x == 0 ? send[0] : __shfl_xor_sync(0xffffffffu, send[x], x);
      const int bit = hf * 16 + 4 * (t ^ x) + 2 * c;
      keep |= uint32_t(dropout_draw_in_word(got, 0u) >= a.drop.threshold) << bit;
      keep |= uint32_t(dropout_draw_in_word(got, 1u) >= a.drop.threshold) << (bit + 1);
    }
  }
  if (j0 + kInnerTile > r.Lk) {
    // Key 8 nt + 2 t + e of the tile is kept for nt < count_e tiles: bits
    // 2 nt + e of each row's half-word.
    const int left = int(r.Lk - j0);  // 1..63 here
    uint32_t valid = 0u;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = (left - 2 * t - e + 7) / 8;  // at most 8: left < 64
      const int count = n < 0 ? 0 : n;
      valid |= (((1u << (2 * count)) - 1u) & 0x5555u) << e;
    }
    keep &= valid | (valid << 16);
  }
  return keep;
}

// Dropout on a warp's 16 x 64 probabilities p (keys j0...): multiplies kept
// ones by 1 / (1 - p) and zeroes the others, and writes the tile's two keep
// words of each row (rows < Lq, words inside the row's ceil(Lk / 32)).
__device__ __forceinline__ void dropout_tile(float (&p)[8][4], const FlashArgs& a, const Block& r,
                                             int64_t row0, int64_t j0, int g, int t) {
  const uint32_t keep = keep_mask(a, r, row0, j0, g, t);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t bit = (keep >> (hf * 16 + 2 * nt + e)) & 1u;
        p[nt][2 * hf + e] = bit ? p[nt][2 * hf + e] * a.inv_keep : 0.0f;
      }
  const int64_t row_words = (r.Lk + 31) / 32;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      // Word w of row hf holds tiles nt = 4w..4w+3, this lane's two keys of
      // tile nt at bits (nt & 3) * 8 + 2t: keep's byte of those tiles with
      // its four bit pairs spread a byte apart, then moved to 2t.
      const uint32_t b = (keep >> (hf * 16 + 8 * w)) & 0xFFu;
      uint32_t spread = (b & 0x0Fu) | ((b & 0xF0u) << 12);              // pairs at 0, 2, 16, 18
      spread = (spread & 0x00030003u) | ((spread & 0x000C000Cu) << 6);  // pairs at 0, 8, 16, 24
      const uint32_t word = quad_or(spread << (2 * t));
      const int64_t i = row0 + g + 8 * hf, index = j0 / 32 + w;
      if (t == 2 * hf + w && i < r.Lq && index < row_words)
        row_of<uint32_t>(a.bits, r, i)[index] = word;
    }
}

// One key tile of the online softmax for a warp's 16 query rows: s holds
// the tile's raw scores Q K^T (keys j0...) and becomes the probabilities
// exp2(scale_log2 (score - running max)); the running max m (of raw scores),
// the sum l and the output rows o are rescaled to the new max. Only a tile
// with a key to leave out (`masked`) adds the key biases (0 or -inf). The
// scale is applied inside the exponent's FFMA (max(scale x) = scale max(x)
// for scale > 0, rounding being monotonic), and a row with no key so far
// shifts by 0 so that its -inf scores give 0 without a test per element.
__device__ __forceinline__ void online_softmax_tile(float (&s)[8][4], float (&o)[8][4],
                                                    float (&m)[2], float (&l)[2], const float* bias,
                                                    bool masked, float scale_log2, int t) {
  if (masked) add_key_biases(s, bias, t);
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
  float corr[2], shift[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    mx[hf] = quad_max(mx[hf]);
    const bool none = mx[hf] == -INFINITY;
    corr[hf] = none ? 1.0f : exp2_approx((m[hf] - mx[hf]) * scale_log2);
    shift[hf] = none ? 0.0f : mx[hf] * scale_log2;
    m[hf] = mx[hf];
    l[hf] *= corr[hf];
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e >> 1;
      const float p = exp2_approx(fmaf(s[nt][e], scale_log2, -shift[hf]));
      s[nt][e] = p;
      l[hf] += p;  // the softmax sums every probability; dropout acts after
      o[nt][e] *= corr[hf];
    }
}

// The forward for 128 query rows: kM 16-row tiles per warp, 8 / kM warps.
// kM = 2 reads each K and V fragment from shared memory once for two row
// tiles (half the shared-memory traffic per product) at the cost of more
// registers per thread (flash_forward_rows_per_warp chooses). K and V tiles
// come by cp.async into two buffers: the next tile's copies are in flight
// while the current one is multiplied, and no register holds them.
template <int kM, bool kDropout>
__global__ void __launch_bounds__(kThreadsPerBlock / kM, 2)
    flash_forward_kernel(FlashArgs a, int64_t tiles) {
  constexpr int kThreads = kThreadsPerBlock / kM;
  RF_DYNAMIC_SHARED(smem);
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sK = sQ + kRowsPerBlock * kLd;  // two tiles of kInnerTile rows
  bf16_t* sV = sK + 2 * kInnerTile * kLd;
  float* sBias = reinterpret_cast<float*>(sV + 2 * kInnerTile * kLd);
  float* sAngles = sBias + kInnerTile;  // kAngleFloats, with RoPE only
  enum { kK, kV, kStreamCount };        // the rows of what the loop reads (RowStream)
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
  const StreamedPair<kThreads> kv{sK, sV, streams[kK], streams[kV], rope ? sAngles : nullptr};
  kv.fetch(0, r, 0, r.Lk, a);
  load_tile<kRowsPerBlock, kThreads>(sQ, a.q, r, i0, r.Lq, a, rope);
  __syncthreads();
  // One row tile: its Q fragments stay in registers. Two: read from sQ
  // each key tile, as registers are short.
  uint32_t qa[1][4][4];
  if constexpr (kM == 1) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) load_a(qa[0][ks], sQ, warp * 16, ks * 16, lane);
  }
  const int64_t row0 = i0 + warp * kM * 16;  // tile mt: rows row0 + 16 mt...
  float o[kM][8][4] = {};
  float m[kM][2], l[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m[mt][hf] = -INFINITY;
      l[mt][hf] = 0.0f;
    }
  int buffer = 0;
  for (int64_t j0 = 0; j0 < r.Lk; j0 += kInnerTile, buffer ^= 1) {
    bf16_t* k_tile = kv.first(buffer);
    bf16_t* v_tile = kv.second(buffer);
    key_tile_ready(kv, buffer, r, j0, a, sBias);
    const bool masked = key_tile_masked(a, r, j0);
    float s[kM][8][4];
    if constexpr (kM == 1)
      mma_rows(s, qa, k_tile, lane);
    else
      mma_rows_shared_a(s, sQ, warp * kM * 16, k_tile, lane);
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      online_softmax_tile(s[mt], o[mt], m[mt], l[mt], sBias, masked, a.scale_log2, t);
      if constexpr (kDropout) dropout_tile(s[mt], a, r, row0 + 16 * mt, j0, g, t);
    }
    mma_accumulator_tile(o, s, v_tile, lane);
    __syncthreads();  // this buffer's readers are done before it is refilled
  }
  // Nothing is in flight here (the last tile's wait left only its empty
  // group; with Lk = 0 no copy was issued): a guard, so no path exits with
  // copies no wait covers.
  cp_async_wait<0>();
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const int64_t tile_row0 = row0 + 16 * mt;
    float inv[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      l[mt][hf] = quad_sum(l[mt][hf]);
      const bool empty = m[mt][hf] == -INFINITY;  // no key to attend to: zeros
      inv[hf] = empty ? 0.0f : 1.0f / l[mt][hf];
      const int64_t i = tile_row0 + g + 8 * hf;
      if (t == 0 && i < r.Lq)
        *row_of<float>(a.lse, r, i) =
            empty ? -INFINITY : (m[mt][hf] * a.scale_log2 + log2f(l[mt][hf])) * kLn2;
    }
    store_rows(o[mt], a.out, a.out_dtype, r, tile_row0, r.Lq, inv, a, false, g, t);
  }
}

// The forward's dynamic shared memory before the angles (the layout at the
// top of the kernel); two blocks an SM must fit.
constexpr size_t kForwardShared =
    size_t(kRowsPerBlock + 4 * kInnerTile) * kLd * sizeof(bf16_t) + kInnerTile * sizeof(float);
static_assert(2 * (kForwardShared + kAngleBytes + kStreamBytes + kReservedPerBlock) <= kSharedPerSm,
              "two forward blocks no longer fit an SM");

// The forward's tiling, process-wide (flash_forward_rows_per_warp).
std::atomic<int> forward_rows_per_warp{16};

}  // namespace

int flash_forward_rows_per_warp() {
  return forward_rows_per_warp.load();
}

void set_flash_forward_rows_per_warp(int rows) {
  RF_CHECK(rows == 16 || rows == 32,
           "flash attention: forward rows per warp must be 16 or 32, got ", rows);
  forward_rows_per_warp.store(rows);
}

bool flash_supported(const KernelTensor& q, const KernelTensor& k, const KernelTensor& v) {
  return (q.ndim == 4 || q.ndim == 3) && q.size(-1) == kD && k.size(-1) == kD && v.size(-1) == kD &&
         rows_aligned(q) && rows_aligned(k) && rows_aligned(v);
}

bool flash_supported(const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                     const KernelTensor& grad_out) {
  return flash_supported(q, k, v) && rows_aligned(grad_out);
}

void flash_forward(Stream stream, const AttentionParams& params, const FlashRope& rope,
                   const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                   const KernelTensor& key_mask, const KernelTensor& segments,
                   const KernelTensor& out, const KernelTensor& lse,
                   const KernelTensor& keep_bits) {
  RF_CHECK(flash_supported(q, k, v), "flash attention: operands not supported");
  RF_CHECK(out.dtype == DType::f32 || out.dtype == DType::bf16,
           "flash attention: out must be f32 or bf16");
  FlashArgs a = make_args(params, rope, q, k, v, key_mask, segments, out, lse, keep_bits);
  const int64_t heads = q.sizes[1];  // [B, H, S, D] and [T, H, D] alike
  const Grid g = grid_of(params, q, k, segments, false);
  if (g.sequences * g.tiles == 0 || heads == 0) return;
  // One kernel per (tiling, dropout): a kernel without dropout carries none
  // of the Philox code's registers.
  const bool wide = forward_rows_per_warp.load(std::memory_order_relaxed) == 32;
  const unsigned threads = wide ? kThreadsPerBlock / 2 : kThreadsPerBlock;
  const auto kernel =
      wide ? (a.drop.on ? flash_forward_kernel<2, true> : flash_forward_kernel<2, false>)
           : (a.drop.on ? flash_forward_kernel<1, true> : flash_forward_kernel<1, false>);
  const size_t shared = kForwardShared + angle_bytes(a);
  allow_shared(kernel, shared);
  RF_LAUNCH(kernel, launch_grid(g, heads), threads, shared, native(stream), a, g.tiles);
}

}  // namespace roformer::kernels::cuda

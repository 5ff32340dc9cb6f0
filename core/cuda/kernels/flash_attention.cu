// Tensor-core softmax attention for bf16 q, k, v at head dim 64 (the
// FlashAttention-2 scheme, written for this project). This file is the
// forward (its per-tile softmax and dropout in flash_attention_forward.cuh);
// flash_attention_backward.cu the backward; the building blocks both share:
// flash_attention_tiles.cuh (tiles, streaming, stores) on
// flash_attention_rope.cuh, flash_attention_mma.cuh and
// flash_attention_args.cuh. On Hopper, flash_attention_wgmma.cu and
// flash_attention_backward_wgmma.cu may take the forward and the fused
// backward's key tiles (set_flash_forward_uses_wgmma and
// set_flash_backward_uses_wgmma).
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
#include <array>
#include <atomic>

#include "core/cuda/kernels/flash_attention_forward.cuh"

namespace roformer::kernels::cuda {

namespace {

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
      if constexpr (kDropout)
        dropout_tile(s[mt], keep_mask(a, r, row0 + 16 * mt, j0, g, t), a, r, row0 + 16 * mt, j0, g,
                     t);
    }
    mma_accumulator_tile(o, s, v_tile, lane);
    __syncthreads();  // this buffer's readers are done before it is refilled
  }
  // Nothing is in flight here (the last tile's wait left only its empty
  // group; with Lk = 0 no copy was issued): a guard, so no path exits with
  // copies no wait covers.
  cp_async_wait<0>();
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
    finish_forward_rows(o[mt], m[mt], l[mt], dropout_gain<kDropout>(a), a, r, row0 + 16 * mt, g, t);
}

// The keep bits of the forward's query rows drawn ahead of it
// (set_flash_keep_bits_ahead), on the forward's grid: a block draws its 128
// rows' words, a thread a word at a time (four Philox blocks of eight keys),
// with the forward's rule and layout (keep_mask, dropout_tile): bit j % 32 of
// word j / 32 for key j, keys past Lk clear, only the row's ceil(Lk / 32)
// words written. Philox alone at full occupancy, where inside the forward
// its rounds take issue slots from the softmax between the products.
template <bool kHighThreshold>
__global__ void __launch_bounds__(kThreadsPerBlock)
    flash_keep_bits_kernel(FlashArgs a, int64_t tiles) {
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq || r.Lk == 0) return;
  const uint32_t rows = uint32_t(r.Lq - i0 < kRowsPerBlock ? r.Lq - i0 : kRowsPerBlock);
  const uint32_t words = uint32_t((r.Lk + 31) / 32);
  const uint32_t offset = dropout_halves_offset(a.drop.threshold);
  uint32_t* const bits = row_of<uint32_t>(a.bits, r, i0);
  // Item (row i, word w) = i words + w, kThreadsPerBlock items apart: the
  // next item's row and word by adding, not dividing.
  const uint32_t row_step = kThreadsPerBlock / words, word_step = kThreadsPerBlock % words;
  uint32_t i = threadIdx.x / words, w = threadIdx.x % words;
  for (; i < rows; i += row_step, w += word_step) {
    if (w >= words) {
      w -= words;
      ++i;
      if (i >= rows) break;
    }
    // Bit 16 e + 4 c + q: draw e of word q of block c (keys 8 c + 2 q + e),
    // which interleave_halves moves to 8 c + 2 q + e.
    uint32_t decided = 0u;
#pragma unroll
    for (int c = 3; c >= 0; --c) {
      const PhiloxCounter x =
          philox4x32(dropout_block(4u * w + uint32_t(c), r.drop_position + uint32_t(i0) + i,
                                   r.drop_sequence, a.drop.site, uint32_t(r.h)),
                     a.drop.key);
      decided = (decided << 4) | block_decisions<kHighThreshold, 1>(x, offset);
    }
    uint32_t word = interleave_halves(decided);
    const int64_t left = r.Lk - 32 * int64_t(w);
    if (left < 32) word &= (1u << left) - 1u;
    bits[int64_t(i) * a.bits.sr + w] = word;
  }
}

// The forward's dynamic shared memory before the angles (the layout at the
// top of the kernel); two blocks an SM must fit.
constexpr size_t kForwardShared =
    size_t(kRowsPerBlock + 4 * kInnerTile) * kLd * sizeof(bf16_t) + kInnerTile * sizeof(float);
static_assert(2 * (kForwardShared + kAngleBytes + kStreamBytes + kReservedPerBlock) <= kSharedPerSm,
              "two forward blocks no longer fit an SM");

// The forward's tiling and products, process-wide (flash_forward_rows_per_warp,
// flash_forward_uses_wgmma).
std::atomic<int> forward_rows_per_warp{16};
std::atomic<bool> forward_wgmma{true};
std::atomic<ForwardSchedule> forward_schedule{ForwardSchedule::automatic};
std::atomic<bool> keep_bits_ahead{true};

}  // namespace

int flash_forward_rows_per_warp() {
  return forward_rows_per_warp.load();
}

void set_flash_forward_rows_per_warp(int rows) {
  RF_CHECK(rows == 16 || rows == 32,
           "flash attention: forward rows per warp must be 16 or 32, got ", rows);
  forward_rows_per_warp.store(rows);
}

bool flash_forward_uses_wgmma() {
  return forward_wgmma.load();
}

void set_flash_forward_uses_wgmma(bool on) {
  forward_wgmma.store(on);
}

ForwardSchedule flash_forward_schedule() {
  return forward_schedule.load(std::memory_order_relaxed);
}

void set_flash_forward_schedule(ForwardSchedule schedule) {
  forward_schedule.store(schedule);
}

bool flash_keep_bits_ahead() {
  return keep_bits_ahead.load(std::memory_order_relaxed);
}

void set_flash_keep_bits_ahead(bool on) {
  keep_bits_ahead.store(on);
}

void launch_keep_bits(Stream stream, const FlashArgs& a, dim3 grid, int64_t tiles) {
  const auto kernel = a.drop.threshold >= kDropoutHighThreshold ? flash_keep_bits_kernel<true>
                                                                : flash_keep_bits_kernel<false>;
  RF_LAUNCH(kernel, grid, kThreadsPerBlock, 0, native(stream), a, tiles);
}

bool flash_wgmma_available(int device) {
  // Asked at every launch while the wgmma kernels are chosen: each device's
  // answer is kept (0 not yet asked, 1 no, 2 yes).
  static std::array<std::atomic<int>, 64> known{};
  const bool cached = device >= 0 && size_t(device) < known.size();
  if (cached) {
    const int answer = known[size_t(device)].load(std::memory_order_relaxed);
    if (answer != 0) return answer == 2;
  }
  int major = 0, minor = 0;
  RF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  RF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool yes = major == 9 && minor == 0;  // sm_90a code runs on sm_90 alone
  if (cached) known[size_t(device)].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
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
  RF_CHECK(!rope.inputs_rotated,
           "flash attention: the forward takes rotated q and k without a RoPE table");
  if (forward_wgmma.load(std::memory_order_relaxed) && flash_wgmma_available(stream.device_index)) {
    flash_forward_wgmma(stream, params, rope, q, k, v, key_mask, segments, out, lse, keep_bits);
    return;
  }
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

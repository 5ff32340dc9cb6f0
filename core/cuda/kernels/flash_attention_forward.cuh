// The forward's steps on a warp's 16 x 64 tile of scores (the mma.sync
// accumulator layout: lane 4 g + t holds rows g and g + 8, columns 8 nt + 2 t
// and + 1), shared by the mma.sync forward (flash_attention.cu) and the wgmma
// one (flash_attention_wgmma.cu), whose warps hold their rows of a 64-row
// accumulator in the same layout: the online softmax, dropout by the shared
// Philox rule with its keep bits, and the rows' log-sum-exp and output.
#pragma once

#include "core/cuda/kernels/flash_attention_tiles.cuh"

namespace roformer::kernels::cuda {

namespace {

// Where keep_mask leaves the decision for row g + 8 hf, key j0 + 8 nt + 2 t
// + e of a warp's 16 x 64 tile: byte nt / 2 holds what lane nt / 2 decided
// for this lane, and in it the row half, the tile's parity and the key's.
__host__ __device__ constexpr int keep_bit(int hf, int nt, int e) {
  return 8 * (nt >> 1) + 4 * hf + 2 * (nt & 1) + e;
}

// Spreads the low 16 bits of x onto the even bits and the high 16 onto the
// odd ones (bit i to 2 i, bit 16 + i to 2 i + 1): a byte permutation, then
// three rounds of swapping the middle two of each group of four.
__device__ __forceinline__ uint32_t interleave_halves(uint32_t x) {
  x = __byte_perm(x, 0u, 0x3120);
  uint32_t d = (x ^ (x >> 4)) & 0x00F000F0u;
  x ^= d ^ (d << 4);
  d = (x ^ (x >> 2)) & 0x0C0C0C0Cu;
  x ^= d ^ (d << 2);
  d = (x ^ (x >> 1)) & 0x22222222u;
  return x ^ d ^ (d << 1);
}

// A Philox block's eight decisions (dropout_keep_halves): word w's low and
// high draws at bits kStride w and 16 + kStride w.
template <bool kHighThreshold, int kStride>
__device__ __forceinline__ uint32_t block_decisions(const PhiloxCounter& w, uint32_t offset) {
  return (dropout_keep_halves<kHighThreshold>(w[0], offset) >> 15) |
         (dropout_keep_halves<kHighThreshold>(w[1], offset) >> (15 - kStride)) |
         (dropout_keep_halves<kHighThreshold>(w[2], offset) >> (15 - 2 * kStride)) |
         (dropout_keep_halves<kHighThreshold>(w[3], offset) >> (15 - 3 * kStride));
}

// The decisions of the four Philox blocks a lane draws for its quad (see
// keep_mask): bit 16 e + 4 w + q is draw e of word w of block q = 2 hf + c
// (row g + 8 hf, tile 2 t + c). A word's two decisions (bits 15 and 31) shift
// to 4 w and 16 + 4 w. One block is drawn at a time: its ten rounds need few
// registers, and the other warps hide their latency.
template <bool kHighThreshold>
__device__ __forceinline__ uint32_t decide_quad_blocks(const FlashArgs& a, const Block& r,
                                                       uint32_t first_block,
                                                       uint32_t first_position) {
  const uint32_t offset = dropout_halves_offset(a.drop.threshold);
  uint32_t decided = 0u;
#pragma unroll 1
  for (int q = 3; q >= 0; --q) {
    const int hf = q >> 1, c = q & 1;
    const PhiloxCounter w =
        philox4x32(dropout_block(first_block + uint32_t(c), first_position + uint32_t(8 * hf),
                                 r.drop_sequence, a.drop.site, uint32_t(r.h)),
                   a.drop.key);
    decided = (decided << 1) | block_decisions<kHighThreshold, 4>(w, offset);
  }
  return decided;
}

// The keep bits of a warp's 16 x 64 tile (keys j0...), at keep_bit. A Philox
// block holds the draws of one row's 8-key tile, and its word w is lane w's
// two keys. The quad's four lanes share rows g and g + 8, so each lane draws
// four of the quad's sixteen blocks (tiles 2 t and 2 t + 1 of both rows) and
// decides all their draws, a word's two at once (dropout_keep_halves); then
// the decisions go to their owners as a 4 x 4 transpose of bytes within the
// quad. Deciding before moving costs two shuffles a tile where moving the
// words cost twelve and their selects, and a decision about two
// instructions where it cost five. Keys past the end are cleared once, in a
// tile that has them.
__device__ __forceinline__ uint32_t keep_mask(const FlashArgs& a, const Block& r, int64_t row0,
                                              int64_t j0, int g, int t) {
  const uint32_t first_block = uint32_t(j0 / kDropoutDrawsPerBlock) + 2u * uint32_t(t);
  const uint32_t first_position = r.drop_position + uint32_t(row0 + g);
  const uint32_t decided = a.drop.threshold >= kDropoutHighThreshold
                               ? decide_quad_blocks<true>(a, r, first_block, first_position)
                               : decide_quad_blocks<false>(a, r, first_block, first_position);
  // Bit 8 w + 2 q + e: byte w is lane w's. Transposed in two exchanges, with
  // lane t ^ 1 (each lane keeps its bytes of its own parity and takes the
  // partner's) and with lane t ^ 2 (halves likewise): byte s of the result is
  // byte t of lane s, bit 2 q + e of it row hf = q / 2, tile 2 s + q % 2.
  const uint32_t mine = interleave_halves(decided);
  const uint32_t pairs =
      __byte_perm(mine, __shfl_xor_sync(0xffffffffu, mine, 1), (t & 1) ? 0x3715 : 0x6240);
  uint32_t keep =
      __byte_perm(pairs, __shfl_xor_sync(0xffffffffu, pairs, 2), (t & 2) ? 0x3276 : 0x5410);
  if (j0 + kInnerTile > r.Lk) {
    const int left = int(r.Lk - j0);  // 1..63 here
    uint32_t valid = 0u;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * nt + 2 * t + e < left)
          valid |= (1u << keep_bit(0, nt, e)) | (1u << keep_bit(1, nt, e));
    keep &= valid;
  }
  return keep;
}

// Dropout's zeros on a warp's 16 x 64 probabilities p by the tile's keep
// bits (at keep_bit): the kept ones' 1 / (1 - p) is one factor of each output
// row (finish_forward_rows).
__device__ __forceinline__ void apply_keep(float (&p)[8][4], uint32_t keep) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t bit = (keep >> keep_bit(hf, nt, e)) & 1u;
        p[nt][2 * hf + e] = bit ? p[nt][2 * hf + e] : 0.0f;
      }
}

// Dropout on a warp's 16 x 64 probabilities p (keys j0...) by the tile's
// keep_mask (drawn from positions alone, so a caller may draw it while the
// tile's scores are still being computed): zeroes the dropped ones
// (apply_keep) and writes the tile's two keep words of each row (rows < Lq,
// words inside the row's ceil(Lk / 32)).
__device__ __forceinline__ void dropout_tile(float (&p)[8][4], uint32_t keep, const FlashArgs& a,
                                             const Block& r, int64_t row0, int64_t j0, int g,
                                             int t) {
  apply_keep(p, keep);
  const int64_t row_words = (r.Lk + 31) / 32;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      // Word w of row hf holds tiles nt = 4w..4w+3, this lane's two keys of
      // tile nt at bits (nt & 3) * 8 + 2t: from keep_bit, those tiles' bit
      // pairs sit at 0, 2, 8 and 10 of keep >> (16 w + 4 hf), moved a byte
      // apart, then to 2t.
      const uint32_t x = keep >> (16 * w + 4 * hf);
      uint32_t spread = (x & 0x0Fu) | ((x & 0x0F00u) << 8);             // pairs at 0, 2, 16, 18
      spread = (spread & 0x00030003u) | ((spread & 0x000C000Cu) << 6);  // pairs at 0, 8, 16, 24
      const uint32_t word = quad_or(spread << (2 * t));
      const int64_t i = row0 + g + 8 * hf, index = j0 / 32 + w;
      if (t == 2 * hf + w && i < r.Lq && index < row_words)
        row_of<uint32_t>(a.bits, r, i)[index] = word;
    }
}

// The keep words of a key tile (keys j0...j0 + 63) for a lane's rows g and
// g + 8 of a warp's 16, from bits drawn before the forward
// (set_flash_keep_bits_ahead): word w of row hf at [2 hf + w], 0 past the
// rows, the row's words or the keys. Loaded a tile ahead of their use, so
// the products of the tile between hide the loads.
struct KeepWords {
  uint32_t w[4];
};
__device__ __forceinline__ KeepWords load_keep_words(const RowStream& bits, const Block& r,
                                                     int64_t row0, int64_t j0, int g) {
  KeepWords k{};
  if (j0 >= r.Lk) return k;
  const int64_t row_words = (r.Lk + 31) / 32;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t i = row0 + g + 8 * hf;
    if (i >= r.Lq) continue;
    const uint32_t* row = bits.row<const uint32_t>(i);
#pragma unroll
    for (int w = 0; w < 2; ++w)
      if (j0 / 32 + w < row_words) k.w[2 * hf + w] = row[j0 / 32 + w];
  }
  return k;
}

// A tile's keep bits at keep_bit from its keep words: what dropout_tile's
// spreading wrote, gathered back (this lane's key pair of tile nt is at bits
// (nt & 3) * 8 + 2t of word nt / 4).
__device__ __forceinline__ uint32_t keep_from_words(const KeepWords& k, int t) {
  uint32_t keep = 0u;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      uint32_t x = (k.w[2 * hf + w] >> (2 * t)) & 0x03030303u;  // pairs at 0, 8, 16, 24
      x = (x & 0x00030003u) | ((x >> 6) & 0x000C000Cu);         // pairs at 0, 2, 16, 18
      x = (x & 0x0Fu) | ((x >> 8) & 0x0F00u);                   // pairs at 0, 2, 8, 10
      keep |= x << (16 * w + 4 * hf);
    }
  return keep;
}

// How far (in log2 units) a row's scores may rise above the max its
// exponents are taken from before that max moves: probabilities up to 2^8,
// an f32 sum and a bf16 P far from their ranges' ends. Most tiles after the
// first raise no row's max that far, and then the output rows need no
// rescaling (FlashAttention-4's lazy rescale): 32 multiplies a tile fewer.
constexpr float kMaxHeadroomLog2 = 8.0f;

// One key tile of the online softmax for a warp's 16 query rows, all but the
// output: s holds the tile's raw scores Q K^T (keys j0...) and becomes the
// probabilities exp2(scale_log2 (score - m)), m being the row's reference
// max (of raw scores): it moves to the tile's new max only where that is
// more than kMaxHeadroomLog2 above it, with the sum l rescaled, and corr
// (1 elsewhere) is what the output rows must then be multiplied by
// (rescale_rows). Returns whether any row of the warp moved (the same in
// every lane), so that a warp with none skips the rescale. The log-sum-exp,
// m + log2 l, is the same whichever reference was kept. Only a tile with a
// key to leave out (`masked`) adds the key biases (0 or -inf). The scale is
// applied inside the exponent's FFMA (max(scale x) = scale max(x) for scale
// > 0, rounding being monotonic), and a row with no key so far shifts by 0
// so that its -inf scores give 0 without a test per element.
__device__ __forceinline__ bool softmax_tile_probabilities(float (&s)[8][4], float (&m)[2],
                                                           float (&l)[2], float (&corr)[2],
                                                           const float* bias, bool masked,
                                                           float scale_log2, int t) {
  if (masked) add_key_biases(s, bias, t);
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
  bool moves[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    mx[hf] = quad_max(mx[hf]);
    // From -inf to a score: +inf, moves; -inf to -inf: NaN, stays.
    moves[hf] = (mx[hf] - m[hf]) * scale_log2 > kMaxHeadroomLog2;
  }
  // Selects, not a branch: ptxas serializes the wgmma products of a
  // pipelined forward whose softmax branches while they run.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    corr[hf] = moves[hf] ? exp2_approx((m[hf] - mx[hf]) * scale_log2) : 1.0f;  // 0 from -inf
    m[hf] = moves[hf] ? mx[hf] : m[hf];
    l[hf] *= corr[hf];
  }
  float shift[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) shift[hf] = m[hf] == -INFINITY ? 0.0f : m[hf] * scale_log2;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e >> 1;
      const float p = exp2_approx(fmaf(s[nt][e], scale_log2, -shift[hf]));
      s[nt][e] = p;
      l[hf] += p;  // the softmax sums every probability; dropout acts after
    }
  return __ballot_sync(0xffffffffu, moves[0] || moves[1]) != 0u;
}

// Output rows o (a warp's 16 x 64) moved to a new running max: row g + 8 hf
// times corr[hf].
__device__ __forceinline__ void rescale_rows(float (&o)[8][4], const float (&corr)[2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] *= corr[e >> 1];
}

// The whole online-softmax step of a key tile (softmax_tile_probabilities,
// then the output rows rescaled where a max moved), for a forward whose
// products of the tile before have landed in o.
__device__ __forceinline__ void online_softmax_tile(float (&s)[8][4], float (&o)[8][4],
                                                    float (&m)[2], float (&l)[2], const float* bias,
                                                    bool masked, float scale_log2, int t) {
  float corr[2];
  if (softmax_tile_probabilities(s, m, l, corr, bias, masked, scale_log2, t)) rescale_rows(o, corr);
}

// The end of the forward for a warp's 16 rows (row0 + g, + 8): the quad's
// partial row sums l added up, the row's log-sum-exp written (natural log,
// as the CPU writes it; -inf for a row with no key) and its output rows
// divided by the sum and multiplied by `gain` (dropout's 1 / (1 - p), which
// the kept probabilities were not: one multiply a row rather than one a
// probability; 1 without dropout) (zeros for a row with no key).
__device__ __forceinline__ void finish_forward_rows(const float (&o)[8][4], const float (&m)[2],
                                                    float (&l)[2], float gain, const FlashArgs& a,
                                                    const Block& r, int64_t row0, int g, int t) {
  float inv[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] = quad_sum(l[hf]);
    const bool empty = m[hf] == -INFINITY;  // no key to attend to: zeros
    inv[hf] = empty ? 0.0f : gain / l[hf];
    const int64_t i = row0 + g + 8 * hf;
    if (t == 0 && i < r.Lq)
      *row_of<float>(a.lse, r, i) =
          empty ? -INFINITY : (m[hf] * a.scale_log2 + log2f(l[hf])) * kLn2;
  }
  store_rows(o, a.out, a.out_dtype, r, row0, r.Lq, inv, a, false, g, t);
}

}  // namespace

}  // namespace roformer::kernels::cuda

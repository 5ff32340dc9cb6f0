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

// Dropout on a warp's 16 x 64 probabilities p (keys j0...) by the tile's
// keep_mask (drawn from positions alone, so a caller may draw it while the
// tile's scores are still being computed): multiplies kept ones by
// 1 / (1 - p) and zeroes the others, and writes the tile's two keep words of
// each row (rows < Lq, words inside the row's ceil(Lk / 32)).
__device__ __forceinline__ void dropout_tile(float (&p)[8][4], uint32_t keep, const FlashArgs& a,
                                             const Block& r, int64_t row0, int64_t j0, int g,
                                             int t) {
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

// The end of the forward for a warp's 16 rows (row0 + g, + 8): the quad's
// partial row sums l added up, the row's log-sum-exp written (natural log,
// as the CPU writes it; -inf for a row with no key) and its output rows
// divided by the sum (zeros for a row with no key).
__device__ __forceinline__ void finish_forward_rows(const float (&o)[8][4], const float (&m)[2],
                                                    float (&l)[2], const FlashArgs& a,
                                                    const Block& r, int64_t row0, int g, int t) {
  float inv[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] = quad_sum(l[hf]);
    const bool empty = m[hf] == -INFINITY;  // no key to attend to: zeros
    inv[hf] = empty ? 0.0f : 1.0f / l[hf];
    const int64_t i = row0 + g + 8 * hf;
    if (t == 0 && i < r.Lq)
      *row_of<float>(a.lse, r, i) =
          empty ? -INFINITY : (m[hf] * a.scale_log2 + log2f(l[hf])) * kLn2;
  }
  store_rows(o, a.out, a.out_dtype, r, row0, r.Lq, inv, a, false, g, t);
}

}  // namespace

}  // namespace roformer::kernels::cuda

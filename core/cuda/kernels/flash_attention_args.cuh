// What the tensor-core attention kernels (flash_attention.cu,
// flash_attention_backward.cu) are launched with and work on: the tile
// sizes, the launch arguments, the sequence, head and tile a block takes,
// rows of an operand (RowStream), and the host side that turns kernel-list
// tensors into those arguments and the grid.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/cuda/kernels/attention_common.cuh"
#include "core/cuda/kernels/flash_attention.h"

namespace roformer::kernels::cuda {

// The launch arguments have names of their own (outside the anonymous
// namespace below): the sm_90a kernels of the wgmma files are launched
// through functions the other kernel files call with them.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Rows of a [B, H, S, D] or [T, H, D] tensor: row i of sequence b, head h is
// at ptr + b * sb + h * sh + (first + i) * sr (elements).
struct Operand {
  void* ptr = nullptr;
  int64_t sb = 0, sh = 0, sr = 0;
};

struct FlashArgs {
  Operand q, k, v, out, lse, bits, grad_out, dq, dk, dv, delta;
  DType out_dtype = DType::f32, grad_dtype = DType::f32;
  int64_t Sq = 0, Sk = 0;  // padded lengths
  bool varlen = false;
  const int64_t* segments = nullptr;  // device [N, 4]
  int64_t seg_s0 = 0, seg_s1 = 0;
  KernelTensor mask;             // padded key mask or undefined
  const float* table = nullptr;  // rope [2, P, 32], or null
  int64_t table_rows = 0;
  bool interleaved = true;
  // Q and K rotated as their tiles load: a table for unrotated inputs (RoPE
  // inside). With a table and rotated inputs (FlashRope::inputs_rotated)
  // only the gradients dq and dk are rotated, as they are written.
  bool rotate_loads = false;
  float scale = 1.0f, scale_log2 = kLog2e;
  DropoutRule drop;
  float inv_keep = 1.0f;
};

// Where the fused backward sums dq: slice s (s < splits) of an f32 scratch
// laid out like q's rows ([rows][H][64]) belongs to the blocks of split s.
struct DqPartials {
  Operand rows;              // slice 0
  int64_t split_stride = 0;  // floats from one slice to the next
  int64_t splits = 1;
};

// The fused backward's key-tile kernel on Hopper's wgmma
// (flash_attention_backward_wgmma.cu, built for sm_90a), launched by
// flash_backward in place of the mma.sync one (flash_attention_backward.cu)
// on `grid` with `splits` blocks a sequence (with RoPE's angle slots
// wherever there is a table); `alternate_sweeps`:
// flash_backward_alternates_sweeps.
void launch_key_tiles_wgmma(Stream stream, const FlashArgs& a, dim3 grid, int64_t splits,
                            const DqPartials& partials, bool alternate_sweeps);

// The dropout keep bits of a forward with `a`'s arguments drawn into a.bits
// by a kernel of their own (flash_attention.cu), on the forward's `grid`
// of `tiles` query tiles a sequence: what the wgmma forward reads when they
// are drawn ahead (set_flash_keep_bits_ahead).
void launch_keep_bits(Stream stream, const FlashArgs& a, dim3 grid, int64_t tiles);

namespace {

constexpr int kD = 64;       // head dimension of this path
constexpr int kLd = kD + 8;  // shared row stride in bf16: rows start 4 banks apart
constexpr int kWarps = 8;
constexpr int kThreadsPerBlock = kWarps * 32;
// Query rows (forward, dq pass) or key rows (key-tile kernel: dk/dv, fused) a block holds.
constexpr int kRowsPerBlock = 16 * kWarps;
// Keys (forward, dq pass) or queries (key-tile kernel) per streamed step.
constexpr int kInnerTile = 64;

// Where a shared tile keeps chunk c (bf16 elements 8c..8c+7, 16 bytes) of
// row `row`, as an element offset. The mma.sync kernels pad each row by 16
// bytes, so the eight rows an ldmatrix reads start in distinct banks.
struct PaddedTile {
  static constexpr int kRowStride = kLd;
  static constexpr bool kReadByWgmma = false;
  __device__ static int chunk(int row, int c) { return row * kLd + 8 * c; }
};
// The wgmma kernels' tiles (flash_attention_wgmma.cu): 128-byte rows with
// chunk c of row r at chunk c ^ (r % 8), the 128-byte swizzle that wgmma
// reads through a shared-memory descriptor; its 8-row atoms must start on
// 1024-byte boundaries.
struct SwizzledTile {
  static constexpr int kRowStride = kD;
  static constexpr bool kReadByWgmma = true;  // through the async proxy: fence_shared_for_wgmma
  __device__ static int chunk(int row, int c) { return row * kD + ((c ^ (row & 7)) << 3); }
};

// The sequence, head and tile a block works on.
struct Block {
  int64_t b = 0, h = 0, tile = 0;  // b: batch row (padded) for operands and mask
  int64_t first = 0;               // first row of the sequence in the operands
  int64_t Lq = 0, Lk = 0;
  uint32_t drop_sequence = 0, drop_position = 0;  // dropout key of row 0
};

// Dropout's 1 / (1 - p) as one factor of a whole row (the forward's outputs,
// the backward's dV), which the kernels leave out of each kept probability;
// 1 without dropout.
template <bool kDropout>
__device__ __forceinline__ float dropout_gain(const FlashArgs& a) {
  return kDropout ? a.inv_keep : 1.0f;
}

__device__ __forceinline__ Block block_of(const FlashArgs& a, int64_t tiles) {
  Block r;
  const int64_t seq = int64_t(blockIdx.x) / tiles;
  r.tile = int64_t(blockIdx.x) % tiles;
  r.h = blockIdx.y;
  if (a.varlen) {
    const int64_t* s = a.segments + seq * a.seg_s0;
    r.first = s[0];
    r.Lq = r.Lk = s[a.seg_s1];
    r.drop_sequence = uint32_t(a.drop.first_sequence + s[2 * a.seg_s1]);
    r.drop_position = uint32_t(s[3 * a.seg_s1]);
  } else {
    r.b = seq;
    r.Lq = a.Sq;
    r.Lk = a.Sk;
    r.drop_sequence = uint32_t(a.drop.first_sequence + seq);
  }
  return r;
}

template <class T>
__device__ __forceinline__ T* row_of(const Operand& o, const Block& r, int64_t i) {
  return static_cast<T*>(o.ptr) + r.b * o.sb + r.h * o.sh + (r.first + i) * o.sr;
}

// Row i of an operand in a block's sequence and head at base + i * stride
// (bytes). row_of's three 64-bit products took ~14 instructions a row
// address, redone at every streamed copy (the tile loops have no registers
// left to keep an address). A block's thread 0 makes the streams of the
// operands its loops copy once, into a `__shared__ RowStream` table (before
// a barrier), so a row costs a shared load and one 32 x 32 -> 64-bit
// multiply-add: check_row_streams makes sure rows and row strides fit 32
// bits.
struct alignas(16) RowStream {
  char* base;
  int64_t stride;

  template <class T>
  __device__ T* row(int64_t i) const {
    return reinterpret_cast<T*>(base + mul_wide(int32_t(i), int32_t(stride)));
  }

  // a b in 64 bits by one mul.wide.s32 (IMAD.WIDE): written as a 64-bit
  // product of sign-extended values, nvcc emits a full 64 x 64 multiply.
  __device__ static int64_t mul_wide(int32_t a, int32_t b) {
#if defined(ROFORMER_SIMT_EMULATION)
    return int64_t(a) * int64_t(b);
#else
    int64_t d;
    asm("mul.wide.s32 %0, %1, %2;\n" : "=l"(d) : "r"(a), "r"(b));
    return d;
#endif
  }
};

template <class T>
__device__ __forceinline__ RowStream row_stream(const Operand& o, const Block& r) {
  return {reinterpret_cast<char*>(const_cast<std::remove_const_t<T>*>(row_of<T>(o, r, 0))),
          o.sr * int64_t(sizeof(T))};
}

// Row addresses by a RowStream, or by an operand and its block: what
// store_row_tiles writes through.
struct StreamRows {
  const RowStream& s;
  template <class T>
  __device__ T* row(int64_t i) const {
    return s.row<T>(i);
  }
};
struct OperandRows {
  const Operand& o;
  const Block& r;
  template <class T>
  __device__ T* row(int64_t i) const {
    return row_of<T>(o, r, i);
  }
};

// --- host side ------------------------------------------------------------------------

inline bool rows_aligned(const KernelTensor& t) {
  if (!t.defined() || t.dtype != DType::bf16 || t.strides[t.ndim - 1] != 1 ||
      reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return false;
  for (int32_t d = 0; d + 1 < t.ndim; ++d)
    if (t.strides[d] % 8 != 0) return false;
  return true;
}

inline Operand operand_of(const KernelTensor& t) {
  if (!t.defined()) return {};
  if (t.ndim == 4) return {t.data, t.strides[0], t.strides[1], t.strides[2]};
  return {t.data, 0, t.strides[1], t.strides[0]};  // token stream [T, H, ...]
}

// lse [B, H, Sq] or [T, H] (and the delta scratch laid out like it).
inline Operand lse_operand(const KernelTensor& lse) {
  if (lse.ndim == 3) return {lse.data, lse.strides[0], lse.strides[1], lse.strides[2]};
  return {lse.data, 0, lse.strides[1], lse.strides[0]};
}

// The tile loops address rows by RowStream: a row index and a row stride in
// bytes must fit 32 bits. Rows: dim -2 ([B, H, S, D], keep bits [B, H, S,
// W]) or 0 ([T, H, D], [T, H, W]).
inline void check_row_streams(const KernelTensor& t, const char* name) {
  if (!t.defined()) return;
  const int32_t row_dim = t.ndim == 4 ? 2 : 0;
  const int64_t bytes = t.strides[row_dim] * int64_t(dtype_size(t.dtype));
  RF_CHECK(t.sizes[row_dim] <= INT32_MAX && bytes <= INT32_MAX && bytes >= INT32_MIN,
           "flash attention: ", name, " has ", t.sizes[row_dim], " rows of stride ", bytes,
           " bytes; the kernels take at most 2^31 - 1 rows and row strides under 2 GiB");
}

inline FlashArgs make_args(const AttentionParams& params, const FlashRope& rope,
                           const KernelTensor& q, const KernelTensor& k, const KernelTensor& v,
                           const KernelTensor& key_mask, const KernelTensor& segments,
                           const KernelTensor& out, const KernelTensor& lse,
                           const KernelTensor& keep_bits) {
  FlashArgs a;
  a.q = operand_of(q);
  a.k = operand_of(k);
  a.v = operand_of(v);
  a.out = operand_of(out);
  a.out_dtype = out.dtype;
  a.varlen = q.ndim == 3;
  RF_CHECK(a.varlen ? (segments.defined() && segments.ndim == 2 && segments.dtype == DType::i64)
                    : q.ndim == 4,
           "flash attention: expected q [B, H, S, D], or [T, H, D] with segments [N, 4] i64");
  RF_CHECK(lse.dtype == DType::f32, "flash attention: lse must be f32");
  if (a.varlen) {
    a.segments = segments.as<const int64_t>();
    a.seg_s0 = segments.strides[0];
    a.seg_s1 = segments.strides[1];
  } else {
    a.Sq = q.sizes[2];
    a.Sk = k.sizes[2];
    a.mask = key_mask;
  }
  a.lse = lse_operand(lse);
  a.bits = operand_of(keep_bits);
  check_row_streams(q, "q");
  check_row_streams(k, "k");
  check_row_streams(v, "v");
  check_row_streams(keep_bits, "keep_bits");
  a.scale = float(params.scale);
  a.scale_log2 = float(params.scale) * kLog2e;
  a.drop = dropout_rule(params);
  a.inv_keep = float(a.drop.inv_keep);
  if (rope.table) {
    const KernelTensor& table = *rope.table;
    // Row p of the table rotates row p of q's and k's sequence (or token)
    // dimension, as the rope kernel's [..., S, D] by [2, S, D/2] does.
    const int32_t seq = a.varlen ? 0 : 2;
    RF_CHECK(table.ndim == 3 && table.sizes[0] == 2 && table.sizes[2] == kD / 2 &&
                 table.dtype == DType::f32 && table.is_contiguous() &&
                 table.sizes[1] == q.sizes[seq] && table.sizes[1] == k.sizes[seq],
             "flash attention: expected a contiguous f32 RoPE table [2, P, 32] with P = ",
             q.sizes[seq], " rows (q's and k's sequence length), got [", table.sizes[0], ", ",
             table.sizes[1], ", ", table.sizes[2], "]");
    // The angles reach shared memory by 16-byte cp.async (copy_angles_async).
    RF_CHECK(reinterpret_cast<uintptr_t>(table.data) % 16 == 0,
             "flash attention: the RoPE table must start on a 16-byte boundary");
    a.table = table.as<const float>();
    a.table_rows = table.sizes[1];
    a.interleaved = rope.interleaved;
    a.rotate_loads = !rope.inputs_rotated;  // make_args alone sets a table
  }
  return a;
}

// Sequences (batch rows or segments), tiles per sequence of `rows` rows.
struct Grid {
  int64_t sequences, tiles;
};
inline Grid grid_of(const AttentionParams& params, const KernelTensor& q, const KernelTensor& k,
                    const KernelTensor& segments, bool keys) {
  if (q.ndim == 4) {
    const int64_t len = keys ? k.sizes[2] : q.sizes[2];
    return {q.sizes[0], (len + kRowsPerBlock - 1) / kRowsPerBlock};
  }
  const int64_t longest = params.longest_segment > 0 ? params.longest_segment : q.sizes[0];
  return {segments.sizes[0], (longest + kRowsPerBlock - 1) / kRowsPerBlock};
}

inline dim3 launch_grid(const Grid& g, int64_t heads) {
  RF_CHECK(g.sequences * g.tiles < (int64_t(1) << 31) && heads <= kMaxGridY,
           "flash attention: grid too large");
  return dim3(unsigned(g.sequences * g.tiles), unsigned(heads));
}

}  // namespace

}  // namespace roformer::kernels::cuda

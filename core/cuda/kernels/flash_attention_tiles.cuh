// The building blocks of the tensor-core attention kernels
// (flash_attention.cu: the forward; flash_attention_backward.cu: the
// backward): the launch arguments and the sequence, head and tile a block
// works on; mma.sync and ldmatrix fragments; cp.async; RoPE applied to
// tiles in shared memory; the double-buffered streaming of two operands;
// and the host side that turns kernel-list tensors into launch arguments.
// Fragment layouts are those of the PTX ISA for mma.m16n8k16 (.bf16): lane =
// 4 g + t holds rows g and g + 8, columns 2t and 2t + 1 of each 8-wide tile.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/cuda/kernels/attention_common.cuh"
#include "core/cuda/kernels/flash_attention.h"

namespace roformer::kernels::cuda {

namespace {

constexpr int kD = 64;       // head dimension of this path
constexpr int kLd = kD + 8;  // shared row stride in bf16: rows start 4 banks apart
constexpr int kWarps = 8;
constexpr int kThreadsPerBlock = kWarps * 32;
// Query rows (forward, dq pass) or key rows (key-tile kernel: dk/dv, fused) a block holds.
constexpr int kRowsPerBlock = 16 * kWarps;
// Keys (forward, dq pass) or queries (key-tile kernel) per streamed step.
constexpr int kInnerTile = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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
  float scale = 1.0f, scale_log2 = kLog2e;
  DropoutRule drop;
  float inv_keep = 1.0f;
};

// The sequence, head and tile a block works on.
struct Block {
  int64_t b = 0, h = 0, tile = 0;  // b: batch row (padded) for operands and mask
  int64_t first = 0;               // first row of the sequence in the operands
  int64_t Lq = 0, Lk = 0;
  uint32_t drop_sequence = 0, drop_position = 0;  // dropout key of row 0
};

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

// --- tensor-core fragments --------------------------------------------------------

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a b for a 16x16 A (row) and a 16x8 B (col), bf16 in, f32 accumulate.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(ROFORMER_SIMT_EMULATION)  // tests/simt: run on the CPU
  const uint32_t b[2] = {b0, b1};
  const float c[4] = {d[0], d[1], d[2], d[3]};
  ::roformer::simt::mma_m16n8k16_bf16(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 bf16 matrices from shared memory by one ldmatrix (.trans when
// kTrans): lanes 8m..8m+7 give the row addresses of matrix m, r[m] is it.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16_t* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::ldmatrix_x4(r, addr, kTrans);
#else
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a shared tile,
// by one ldmatrix: a[0..3] are the 8x8 matrices (rows r0 / r0 + 8, columns
// k0 / k0 + 8) in the order the mma takes them.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16_t* s, int r0, int k0,
                                       int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16_t* p = s + (r0 + r + (m & 1) * 8) * kLd + k0 + (m >> 1) * 8;
  ldmatrix_x4<false>(a, p);
}

// B fragments of columns [n0, n0 + 8) (b[0], b[1]) and [n0 + 8, n0 + 16)
// (b[2], b[3]), k [k0, k0 + 16), where B[k][n] = s[n][k] (the tile's rows
// are B's columns: K for Q K^T), by one ldmatrix: four 8x8 matrices (rows n,
// columns k) whose row addresses lanes 8m..8m+7 give.
__device__ __forceinline__ void load_b_pair(uint32_t (&b)[4], const bf16_t* s, int n0, int k0,
                                            int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16_t* p = s + (n0 + r + (m >> 1) * 8) * kLd + k0 + (m & 1) * 8;
  ldmatrix_x4<false>(b, p);
}

// B fragments of the 8-wide column tiles starting at n_a (b[0], b[1]) and
// n_b (b[2], b[3]), k [k0, k0 + 16), where B[k][n] = s[k][n] (V for P V, K
// for dS K): four 8x8 matrices loaded transposed by ldmatrix.
__device__ __forceinline__ void load_b_trans_tiles(uint32_t (&b)[4], const bf16_t* s, int k0,
                                                   int n_a, int n_b, int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16_t* p = s + (k0 + r + (m & 1) * 8) * kLd + n_a + (m >> 1) * (n_b - n_a);
  ldmatrix_x4<true>(b, p);
}

// load_b_trans_tiles of the columns [n0, n0 + 16).
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], const bf16_t* s, int k0, int n0,
                                             int lane) {
  load_b_trans_tiles(b, s, k0, n0, n0 + 8, lane);
}

// An A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of A = s^T,
// whose columns are the shared tile's rows (dS for dQ = dS K, from the dS^T
// the key-major warps wrote): four 8x8 matrices loaded transposed, matrix m
// from rows k0 + 8 (m >> 1) of s at column r0 + 8 (m & 1).
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16_t* s, int r0, int k0,
                                             int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16_t* p = s + (k0 + r + (m >> 1) * 8) * kLd + r0 + (m & 1) * 8;
  ldmatrix_x4<true>(a, p);
}

// Asynchronous copies of kBytes from global to shared memory (sm_80+): no
// registers hold the data on its way, and a thread's copies become visible
// to itself at the wait_group that covers them (to others after a barrier).
// 16 bytes go by cp.async.cg (tiles, RoPE angles); 4 bytes by .ca, which
// .cg does not take (rows of lse, D and keep words: not 16-byte aligned).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* shared, const void* global) {
  static_assert(kBytes == 16 || kBytes == 4, "cp.async of 16 or 4 bytes");
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(shared));
#if defined(ROFORMER_SIMT_EMULATION)
  simt_cp_async<kBytes>(addr, global);
#else
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(global) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(addr), "l"(global) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most kPending of the thread's newest groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::cp_async_wait(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// The A fragment for keys (or queries) [16 kk, 16 kk + 16) of a 16 x 64
// accumulator c[8][4]: the accumulator layout of two 8-wide tiles is the A
// layout of one 16-wide step.
__device__ __forceinline__ void accumulator_as_a(uint32_t (&a)[4], const float (&c)[8][4], int kk) {
  a[0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// acc[m][16 x 64] += A (16 x 64, from the accumulator c[m]) times the shared
// tile s [64][kLd] read as B[k][n] = s[k][n], for kM row tiles: each B
// fragment read from shared memory serves all kM tiles.
template <int kM>
__device__ __forceinline__ void mma_accumulator_tile(float (&acc)[kM][8][4],
                                                     const float (&c)[kM][8][4], const bf16_t* s,
                                                     int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) accumulator_as_a(a[m], c[m], kk);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      load_b_trans(b, s, kk * 16, np * 16, lane);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma(acc[m][2 * np], a[m], b[0], b[1]);
        mma(acc[m][2 * np + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// c[m][16 x 64] = A_m (16 x 64) times B[k][n] = s[n][k] for the 64 rows n of
// the shared tile s, for kM row tiles sharing each B fragment read from
// shared memory; a_of(a, ks) gives the tiles' A fragments of k step ks.
template <int kM, class AFragments>
__device__ __forceinline__ void mma_rows_of(float (&c)[kM][8][4], AFragments a_of, const bf16_t* s,
                                            int lane) {
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[m][nt][e] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    uint32_t a[kM][4];
    a_of(a, ks);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      load_b_pair(b, s, np * 16, ks * 16, lane);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma(c[m][2 * np], a[m], b[0], b[1]);
        mma(c[m][2 * np + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// mma_rows_of with the A fragments held in registers (a[m][ks]).
template <int kM>
__device__ __forceinline__ void mma_rows(float (&c)[kM][8][4], const uint32_t (&a)[kM][4][4],
                                         const bf16_t* s, int lane) {
  mma_rows_of(
      c,
      [&](uint32_t(&frag)[kM][4], int ks) {
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
          for (int e = 0; e < 4; ++e) frag[m][e] = a[m][ks][e];
      },
      s, lane);
}

// mma_rows_of with the A fragments read from the shared tile sa (rows
// a_row0 + 16 m...) as they are needed rather than held in registers: for
// kM = 2, where holding them would spill.
template <int kM>
__device__ __forceinline__ void mma_rows_shared_a(float (&c)[kM][8][4], const bf16_t* sa,
                                                  int a_row0, const bf16_t* s, int lane) {
  mma_rows_of(
      c,
      [&](uint32_t(&frag)[kM][4], int ks) {
#pragma unroll
        for (int m = 0; m < kM; ++m) load_a(frag[m], sa, a_row0 + 16 * m, ks * 16, lane);
      },
      s, lane);
}

// 2^x by one MUFU.EX2 (ex2.approx.ftz): results under 2^-126 flush to 0,
// which no probability here can tell. exp2f as compiled without fast-math
// also checks the range and scales twice to keep subnormal results; in the
// softmax loops those checks' predicates ran out and spilled into bit masks
// (ptxas sm_90: ~8 instructions an element, a third of the forward's loop).
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(ROFORMER_SIMT_EMULATION)
  const float y = std::exp2(x);
  return y < 0x1p-126f ? 0.0f : y;
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ uint32_t quad_or(uint32_t x) {
  x |= __shfl_xor_sync(0xffffffffu, x, 1);
  return x | __shfl_xor_sync(0xffffffffu, x, 2);
}

// --- RoPE ---------------------------------------------------------------------------

// Rotates the pair (x0, x1) by the angle whose cosine and sine are c, s
// (the backward passes -s: the inverse rotation).
__device__ __forceinline__ void rotate_pair(float& x0, float& x1, float c, float s) {
  const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
  x0 = y0;
  x1 = y1;
}

// Row `pos` of the RoPE table [2, P, 32]: its cosines and its sines.
struct AngleRows {
  const float* cos;
  const float* sin;
};
__device__ __forceinline__ AngleRows angle_rows(const FlashArgs& a, int64_t pos) {
  return {a.table + pos * (kD / 2), a.table + (a.table_rows + pos) * (kD / 2)};
}

// Rotates the pair (x0, x1) by pair k's angle at table row `pos`; inverse
// rotates by minus the angle (the backward).
__device__ __forceinline__ void rotate_by_table(float& x0, float& x1, const FlashArgs& a,
                                                int64_t pos, int k, bool inverse) {
  const AngleRows row = angle_rows(a, pos);
  rotate_pair(x0, x1, row.cos[k], inverse ? -row.sin[k] : row.sin[k]);
}

// A thread moves dims [8c, 8c + 8) (lo) and [8c + 32, 8c + 40) (hi) of a row,
// which hold eight whole RoPE pairs in either layout. Its local pair n is
// pair chunk_pair(n, c) of the table: interleaved, 4c..4c+3 (in lo) then
// 16+4c..16+4c+3 (in hi); half, 8c..8c+7 (across lo and hi). Local pairs
// 0..3 and 4..7 are each four consecutive table columns.
__device__ __forceinline__ int chunk_pair(int n, int c, bool interleaved) {
  return interleaved ? (n < 4 ? 4 * c + n : 16 + 4 * c + n - 4) : 8 * c + n;
}

// The cosines and sines of a chunk's eight local pairs at one position.
struct ChunkAngles {
  float cos[8], sin[8];
};

__device__ __forceinline__ ChunkAngles angles_from_table(const FlashArgs& a, int64_t pos, int c) {
  ChunkAngles r;
  const AngleRows row = angle_rows(a, pos);
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const int k = chunk_pair(n, c, a.interleaved);
    r.cos[n] = row.cos[k];
    r.sin[n] = row.sin[k];
  }
  return r;
}

// A chunk's angles staged in shared memory by copy_angles_async: a slot of
// kAngleSlot floats holding cos 0..7 then sin 0..7 (the 16 B loads of eight
// consecutive threads fall in distinct bank groups: 20 is 5 chunks of 16 B).
constexpr int kAngleSlot = 20;

__device__ __forceinline__ ChunkAngles angles_from_slot(const float* slot) {
  ChunkAngles r;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const float4 c = reinterpret_cast<const float4*>(slot)[q];
    const float4 s = reinterpret_cast<const float4*>(slot + 8)[q];
    r.cos[4 * q] = c.x, r.cos[4 * q + 1] = c.y, r.cos[4 * q + 2] = c.z, r.cos[4 * q + 3] = c.w;
    r.sin[4 * q] = s.x, r.sin[4 * q + 1] = s.y, r.sin[4 * q + 2] = s.z, r.sin[4 * q + 3] = s.w;
  }
  return r;
}

// Rotates the values of chunk c of a row (x: dims 8c..., y: 8c + 32...) by
// its eight angles, or by minus them when `inverse` (a gradient rotated back).
__device__ __forceinline__ void rotate_chunk_values(float (&x)[8], float (&y)[8],
                                                    const ChunkAngles& w, bool interleaved,
                                                    bool inverse) {
  const float sign = inverse ? -1.0f : 1.0f;
  if (interleaved) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      rotate_pair(x[2 * m], x[2 * m + 1], w.cos[m], sign * w.sin[m]);
      rotate_pair(y[2 * m], y[2 * m + 1], w.cos[4 + m], sign * w.sin[4 + m]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) rotate_pair(x[e], y[e], w.cos[e], sign * w.sin[e]);
  }
}

// Rotates chunk c of a row (lo, hi as above) by its eight angles.
__device__ __forceinline__ void rotate_chunks(uint4& lo, uint4& hi, const ChunkAngles& w,
                                              bool interleaved) {
  float x[8], y[8];
  const bf16_t* pl = reinterpret_cast<const bf16_t*>(&lo);
  const bf16_t* ph = reinterpret_cast<const bf16_t*>(&hi);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    x[e] = __bfloat162float(pl[e]);
    y[e] = __bfloat162float(ph[e]);
  }
  rotate_chunk_values(x, y, w, interleaved, false);
  uint32_t* wl = reinterpret_cast<uint32_t*>(&lo);
  uint32_t* wh = reinterpret_cast<uint32_t*>(&hi);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    wl[m] = pack_bf16(x[2 * m], x[2 * m + 1]);
    wh[m] = pack_bf16(y[2 * m], y[2 * m + 1]);
  }
}

// Rows [r0, r0 + kRows) of a bf16 operand copied to a shared tile (the
// block's own rows, loaded once), rotated by the RoPE table when `rotate`.
// Each thread moves chunk c of a row: every RoPE pair of either layout lies
// within what one thread holds. Rows past `limit` are zeros.
template <int kRows, int kThreads = kThreadsPerBlock>
__device__ __forceinline__ void load_tile(bf16_t* s, const Operand& o, const Block& r, int64_t r0,
                                          int64_t limit, const FlashArgs& a, bool rotate) {
  static_assert(kRows * 4 % kThreads == 0, "a tile's row chunks split evenly over the block");
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    const int64_t i = r0 + row;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (i < limit) {
      const bf16_t* p = row_of<const bf16_t>(o, r, i);
      lo = *reinterpret_cast<const uint4*>(p + 8 * c);
      hi = *reinterpret_cast<const uint4*>(p + 8 * c + 32);
      if (rotate) rotate_chunks(lo, hi, angles_from_table(a, r.first + i, c), a.interleaved);
    }
    *reinterpret_cast<uint4*>(s + row * kLd + 8 * c) = lo;
    *reinterpret_cast<uint4*>(s + row * kLd + 8 * c + 32) = hi;
  }
}

// Rows [r0, r0 + kRows) of a bf16 operand copied to a shared tile by
// cp.async, split over kThreads threads as load_tile splits them (the chunks
// rotate_own_chunks rotates); rows past `limit` are zeros, stored at once.
template <int kRows, int kThreads>
__device__ __forceinline__ void copy_tile_async(bf16_t* s, const RowStream& rows, int64_t r0,
                                                int64_t limit) {
  const RowStream o = rows;  // one shared load: cp.async's memory clobber would reload it per row
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    const int64_t i = r0 + row;
    bf16_t* d = s + row * kLd + 8 * c;
    if (i < limit) {
      const bf16_t* p = o.row<const bf16_t>(i);
      cp_async<16>(d, p + 8 * c);
      cp_async<16>(d + 32, p + 8 * c + 32);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(d + 32) = make_uint4(0, 0, 0, 0);
    }
  }
}

// The RoPE angles of the chunks this thread copies with copy_tile_async
// (rows r0...), by cp.async into their slots of `slots` (kRows * 4 slots),
// in the same group as the tile: the thread's own wait covers them, so the
// rotation after it needs no barrier and no global read. Rows past `limit`
// are not rotated and get none.
template <int kRows, int kThreads>
__device__ __forceinline__ void copy_angles_async(float* slots, const Block& r, int64_t r0,
                                                  int64_t limit, const FlashArgs& a) {
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    const int64_t i = r0 + row;
    if (i >= limit) continue;
    const AngleRows angles = angle_rows(a, r.first + i);
    const int k0 = chunk_pair(0, c, a.interleaved), k1 = chunk_pair(4, c, a.interleaved);
    float* slot = slots + item * kAngleSlot;
    cp_async<16>(slot, angles.cos + k0);
    cp_async<16>(slot + 4, angles.cos + k1);
    cp_async<16>(slot + 8, angles.sin + k0);
    cp_async<16>(slot + 12, angles.sin + k1);
  }
}

// Rotates the chunks of a shared tile that this thread copied with
// copy_tile_async (rows r0... below `limit`), once its wait has covered them,
// by angles_of(item, row, c): the chunk's eight angles.
template <int kRows, int kThreads, class AnglesOf>
__device__ __forceinline__ void rotate_own_chunks_with(bf16_t* s, int64_t r0, int64_t limit,
                                                       bool interleaved, AnglesOf angles_of) {
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    if (r0 + row >= limit) continue;
    uint4* lo = reinterpret_cast<uint4*>(s + row * kLd + 8 * c);
    uint4* hi = reinterpret_cast<uint4*>(s + row * kLd + 8 * c + 32);
    uint4 x = *lo, y = *hi;
    rotate_chunks(x, y, angles_of(item, row, c), interleaved);
    *lo = x;
    *hi = y;
  }
}

// ... by the angles copy_angles_async staged in `slots` (its wait covers
// both).
template <int kRows, int kThreads>
__device__ __forceinline__ void rotate_own_chunks(bf16_t* s, const float* slots, int64_t r0,
                                                  int64_t limit, bool interleaved) {
  rotate_own_chunks_with<kRows, kThreads>(s, r0, limit, interleaved, [slots](int item, int, int) {
    return angles_from_slot(slots + item * kAngleSlot);
  });
}

// ... by angles read from the table in global memory (the key tiles of the
// key-tile kernel, which has no room for angle slots).
template <int kRows, int kThreads>
__device__ __forceinline__ void rotate_own_chunks_by_table(bf16_t* s, const Block& r, int64_t r0,
                                                           int64_t limit, const FlashArgs& a) {
  rotate_own_chunks_with<kRows, kThreads>(s, r0, limit, a.interleaved, [&](int, int row, int c) {
    return angles_from_table(a, r.first + r0 + row, c);
  });
}

// Floats of shared memory a StreamedPair's angle slots take (two buffers).
constexpr size_t kAngleFloats = size_t(2) * kInnerTile * 4 * kAngleSlot;

// Two operands streamed tile by tile (K and V, or Q and dO), each through
// two shared buffers of kInnerTile rows: tile n lives in buffer n % 2. With
// `angles` (RoPE), the first operand is rotated as each tile arrives, by
// angles copied with the tile into two buffers of slots.
template <int kThreads>
struct StreamedPair {
  bf16_t* shared0;
  bf16_t* shared1;
  const RowStream& operand0;  // in shared memory (RowStream)
  const RowStream& operand1;
  float* angles = nullptr;  // kAngleFloats, or null: no rotation

  __device__ bf16_t* first(int buffer) const { return shared0 + buffer * kInnerTile * kLd; }
  __device__ bf16_t* second(int buffer) const { return shared1 + buffer * kInnerTile * kLd; }
  __device__ float* slots(int buffer) const {
    return angles + buffer * kInnerTile * 4 * kAngleSlot;
  }
  // Queues the copies of the tile at rows r0 into `buffer` (and its angles)
  // and commits them as one group (an empty one when r0 is past `limit`), so
  // a wait for all but the newest group always covers the tile before.
  __device__ void fetch(int buffer, const Block& r, int64_t r0, int64_t limit,
                        const FlashArgs& a) const {
    if (r0 < limit) {
      copy_tile_async<kInnerTile, kThreads>(first(buffer), operand0, r0, limit);
      copy_tile_async<kInnerTile, kThreads>(second(buffer), operand1, r0, limit);
      if (angles) copy_angles_async<kInnerTile, kThreads>(slots(buffer), r, r0, limit, a);
    }
    cp_async_commit();
  }
  // The tile at rows r0 is in `buffer`: queues the next one into the other
  // buffer, waits for this thread's copies of this one, and rotates its
  // chunks of the first operand when there are angles. A barrier must come
  // before other threads read the tile.
  __device__ void arrive(int buffer, const Block& r, int64_t r0, int64_t limit,
                         const FlashArgs& a) const {
    fetch(buffer ^ 1, r, r0 + kInnerTile, limit, a);
    cp_async_wait<1>();  // this tile's copies have landed, the next tile's may not
    if (angles)
      rotate_own_chunks<kInnerTile, kThreads>(first(buffer), slots(buffer), r0, limit,
                                              a.interleaved);
  }
};

// Writes kN 8-wide column tiles of a 16-row accumulator (rows row0 + g,
// row0 + g + 8; local tile n is the operand's column tile tile_of(n)) to a
// gradient or output operand (its rows: OperandRows or StreamRows), scaled
// per row, rotated back by the RoPE table when `unrotate` (the gradient of
// the unrotated input). Rotating needs each pair whole: in the half layout
// tile n's partner (32 columns on) must be local tile n + kN / 2.
template <int kN, class TileOf, class Rows>
__device__ __forceinline__ void store_row_tiles(const float (&c)[kN][4], TileOf tile_of,
                                                const Rows& rows, DType dtype, const Block& r,
                                                int64_t row0, int64_t limit,
                                                const float (&row_scale)[2], const FlashArgs& a,
                                                bool unrotate, int g, int t) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t i = row0 + g + 8 * hf;
    if (i >= limit) continue;
    float x[kN][2];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      x[n][0] = c[n][2 * hf] * row_scale[hf];
      x[n][1] = c[n][2 * hf + 1] * row_scale[hf];
    }
    if (unrotate) {
      const int64_t pos = r.first + i;
      if (a.interleaved) {
#pragma unroll
        for (int n = 0; n < kN; ++n)
          rotate_by_table(x[n][0], x[n][1], a, pos, tile_of(n) * 4 + t, true);
      } else {
#pragma unroll
        for (int n = 0; n < kN / 2; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            rotate_by_table(x[n][e], x[n + kN / 2][e], a, pos, tile_of(n) * 8 + 2 * t + e, true);
      }
    }
    // A thread's two columns (an even one and the next) by one store where
    // the row allows it (outputs may be views with any alignment).
    if (dtype == DType::f32) {
      float* p = rows.template row<float>(i);
      const bool pairs = reinterpret_cast<uintptr_t>(p) % sizeof(float2) == 0;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        float* q = p + tile_of(n) * 8 + 2 * t;
        if (pairs) {
          *reinterpret_cast<float2*>(q) = make_float2(x[n][0], x[n][1]);
        } else {
          q[0] = x[n][0];
          q[1] = x[n][1];
        }
      }
    } else {
      bf16_t* p = rows.template row<bf16_t>(i);
      const bool pairs = reinterpret_cast<uintptr_t>(p) % sizeof(uint32_t) == 0;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        bf16_t* q = p + tile_of(n) * 8 + 2 * t;
        if (pairs) {
          *reinterpret_cast<uint32_t*>(q) = pack_bf16(x[n][0], x[n][1]);
        } else {
          q[0] = __float2bfloat16_rn(x[n][0]);
          q[1] = __float2bfloat16_rn(x[n][1]);
        }
      }
    }
  }
}

// Writes a 16 x 64 accumulator's rows (row0 + g, row0 + g + 8): store_row_tiles
// of all eight column tiles.
__device__ __forceinline__ void store_rows(const float (&c)[8][4], const Operand& o, DType dtype,
                                           const Block& r, int64_t row0, int64_t limit,
                                           const float (&row_scale)[2], const FlashArgs& a,
                                           bool unrotate, int g, int t) {
  store_row_tiles(
      c, [](int n) { return n; }, OperandRows{o, r}, dtype, r, row0, limit, row_scale, a, unrotate,
      g, t);
}

// Additive bias of key j: 0, or -inf for a masked key or one past the end.
__device__ __forceinline__ float key_bias(const FlashArgs& a, const Block& r, int64_t j) {
  if (j >= r.Lk) return -INFINITY;
  if (!a.varlen && !key_kept(a.mask, r.b, j)) return -INFINITY;
  return 0.0f;
}

// Whether the key tile of `keys` keys at j0 has a key to leave out (one past
// the end, or a padded batch's mask): only such tiles need the key biases.
__device__ __forceinline__ bool key_tile_masked(const FlashArgs& a, const Block& r, int64_t j0,
                                                int64_t keys = kInnerTile) {
  return j0 + keys > r.Lk || (!a.varlen && a.mask.defined());
}

// Adds the key biases of a 64-key tile (sBias, from key_tile_ready) to a
// warp's 16 x 64 scores: column 8 nt + 2t + (e & 1) of each row.
__device__ __forceinline__ void add_key_biases(float (&s)[8][4], const float* bias, int t) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] += bias[nt * 8 + 2 * t + (e & 1)];
}

// Key tile j0 (K and V in `buffer` of kv) made ready for the whole block:
// this thread's copies landed and its K chunks rotated, the tile's key biases
// in sBias (a tile with a key to leave out: the others read none), then a
// barrier. The forward and the dq pass open each key tile so.
template <int kThreads>
__device__ __forceinline__ void key_tile_ready(const StreamedPair<kThreads>& kv, int buffer,
                                               const Block& r, int64_t j0, const FlashArgs& a,
                                               float* sBias) {
  kv.arrive(buffer, r, j0, r.Lk, a);
  if (threadIdx.x < kInnerTile && key_tile_masked(a, r, j0))  // others read no bias
    sBias[threadIdx.x] = key_bias(a, r, j0 + threadIdx.x);
  __syncthreads();  // every thread's copies, rotations and biases are visible
}

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
  }
  return a;
}

// Two blocks an SM (the forward, and the dq pass's default) must fit the
// H100's 228 KB of shared memory an SM, 1 KB of it reserved per block, with
// RoPE's angles too: a larger layout would silently halve the warps an SM.
constexpr size_t kSharedPerSm = 228 * 1024, kReservedPerBlock = 1024;
constexpr size_t kAngleBytes = kAngleFloats * sizeof(float);
// The static shared memory of a kernel's RowStreams, at most.
constexpr size_t kStreamBytes = 8 * sizeof(RowStream);

// Shared bytes of the streamed tiles' RoPE angles: none without a table.
inline size_t angle_bytes(const FlashArgs& a) {
  return a.table ? kAngleBytes : 0;
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

// Tensor-core softmax attention for bf16 q, k, v at head dim 64 (the
// FlashAttention-2 scheme, written for this project):
// - forward: a block owns 128 query rows (8 warps x 16); key/value tiles of
//   64 rows pass through shared memory; S = Q K^T and O += P V run on
//   mma.sync m16n8k16 (bf16 in, f32 accumulation) with an online softmax in
//   base 2; the row log-sum-exp (natural log, as the CPU writes it) and, with
//   dropout, the keep bits of the shared Philox rule are written;
// - backward recomputes P from q, k and the log-sum-exp, in two passes so
//   every gradient row has one owner and no float atomics: the dq pass (a
//   block per 128 query rows, which also writes D = dO . O) and the dk/dv
//   pass (a block per 128 key rows, reading D);
// - RoPE inside: with a table, Q and K tiles are rotated as they are loaded
//   (either pair layout), and dq, dk are rotated back before they are written,
//   so they are the gradients of the unrotated q and k;
// - padded batches (key mask) and token streams (segments of (first token,
//   length, row, position)) share the kernels: a block works on one
//   sequence (a batch row or a segment), one head, one tile.
// Fragment layouts are those of the PTX ISA for mma.m16n8k16 (.bf16): lane =
// 4 g + t holds rows g and g + 8, columns 2t and 2t + 1 of each 8-wide tile.
#include <algorithm>
#include <atomic>

#include "core/cuda/kernels/attention_common.cuh"
#include "core/cuda/kernels/flash_attention.h"

namespace roformer::kernels::cuda {

namespace {

constexpr int kD = 64;       // head dimension of this path
constexpr int kLd = kD + 8;  // shared row stride in bf16: rows start 4 banks apart
constexpr int kWarps = 8;
constexpr int kThreadsPerBlock = kWarps * 32;
constexpr int kRowsPerBlock = 16 * kWarps;  // query rows (forward, dq) or key rows (dk/dv)
constexpr int kInnerTile = 64;              // keys (forward, dq) or queries (dk/dv) per step
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

// A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a shared tile,
// by one ldmatrix: a[0..3] are the 8x8 matrices (rows r0 / r0 + 8, columns
// k0 / k0 + 8) in the order the mma takes them.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16_t* s, int r0, int k0,
                                       int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16_t* p = s + (r0 + r + (m & 1) * 8) * kLd + k0 + (m >> 1) * 8;
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::ldmatrix_x4(a, addr, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
#endif
}

// B fragments of columns [n0, n0 + 8) (b[0], b[1]) and [n0 + 8, n0 + 16)
// (b[2], b[3]), k [k0, k0 + 16), where B[k][n] = s[n][k] (the tile's rows
// are B's columns: K for Q K^T), by one ldmatrix: four 8x8 matrices (rows n,
// columns k) whose row addresses lanes 8m..8m+7 give.
__device__ __forceinline__ void load_b_pair(uint32_t (&b)[4], const bf16_t* s, int n0, int k0,
                                            int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16_t* p = s + (n0 + r + (m >> 1) * 8) * kLd + k0 + (m & 1) * 8;
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::ldmatrix_x4(b, addr, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
#endif
}

// B fragments of columns [n0, n0 + 8) (b[0], b[1]) and [n0 + 8, n0 + 16)
// (b[2], b[3]), k [k0, k0 + 16), where B[k][n] = s[k][n] (V for P V): four
// 8x8 matrices loaded transposed by ldmatrix.
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], const bf16_t* s, int k0, int n0,
                                             int lane) {
  const int m = lane >> 3, r = lane & 7;
  const bf16_t* p = s + (k0 + r + (m & 1) * 8) * kLd + n0 + (m >> 1) * 8;
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
#if defined(ROFORMER_SIMT_EMULATION)
  ::roformer::simt::ldmatrix_x4(b, addr, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
#endif
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
  if (interleaved) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      rotate_pair(x[2 * m], x[2 * m + 1], w.cos[m], w.sin[m]);
      rotate_pair(y[2 * m], y[2 * m + 1], w.cos[4 + m], w.sin[4 + m]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) rotate_pair(x[e], y[e], w.cos[e], w.sin[e]);
  }
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
__device__ __forceinline__ void copy_tile_async(bf16_t* s, const Operand& o, const Block& r,
                                                int64_t r0, int64_t limit) {
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    const int64_t i = r0 + row;
    bf16_t* d = s + row * kLd + 8 * c;
    if (i < limit) {
      const bf16_t* p = row_of<const bf16_t>(o, r, i);
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
// copy_tile_async, by the angles copy_angles_async staged, once its wait has
// covered both.
template <int kRows, int kThreads>
__device__ __forceinline__ void rotate_own_chunks(bf16_t* s, const float* slots, int64_t r0,
                                                  int64_t limit, bool interleaved) {
#pragma unroll
  for (int n = 0; n < kRows * 4 / kThreads; ++n) {
    const int item = threadIdx.x + n * kThreads;
    const int row = item >> 2, c = item & 3;
    if (r0 + row >= limit) continue;
    uint4* lo = reinterpret_cast<uint4*>(s + row * kLd + 8 * c);
    uint4* hi = reinterpret_cast<uint4*>(s + row * kLd + 8 * c + 32);
    uint4 x = *lo, y = *hi;
    rotate_chunks(x, y, angles_from_slot(slots + item * kAngleSlot), interleaved);
    *lo = x;
    *hi = y;
  }
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
  const Operand& operand0;
  const Operand& operand1;
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
      copy_tile_async<kInnerTile, kThreads>(first(buffer), operand0, r, r0, limit);
      copy_tile_async<kInnerTile, kThreads>(second(buffer), operand1, r, r0, limit);
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

// Writes a 16 x 64 accumulator's rows (row0 + g, row0 + g + 8) to a gradient
// or output operand, scaled per row, rotated back by the RoPE table when
// `unrotate` (the gradient of the unrotated input).
__device__ __forceinline__ void store_rows(float (&c)[8][4], const Operand& o, DType dtype,
                                           const Block& r, int64_t row0, int64_t limit,
                                           const float (&row_scale)[2], const FlashArgs& a,
                                           bool unrotate, int g, int t) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t i = row0 + g + 8 * hf;
    if (i >= limit) continue;
    float x[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      x[nt][0] = c[nt][2 * hf] * row_scale[hf];
      x[nt][1] = c[nt][2 * hf + 1] * row_scale[hf];
    }
    if (unrotate) {
      const int64_t pos = r.first + i;
      if (a.interleaved) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          rotate_by_table(x[nt][0], x[nt][1], a, pos, nt * 4 + t, true);
      } else {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            rotate_by_table(x[nt][e], x[nt + 4][e], a, pos, nt * 8 + 2 * t + e, true);
      }
    }
    if (dtype == DType::f32) {
      float* p = row_of<float>(o, r, i);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        p[nt * 8 + 2 * t] = x[nt][0];
        p[nt * 8 + 2 * t + 1] = x[nt][1];
      }
    } else {
      bf16_t* p = row_of<bf16_t>(o, r, i);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        p[nt * 8 + 2 * t] = __float2bfloat16_rn(x[nt][0]);
        p[nt * 8 + 2 * t + 1] = __float2bfloat16_rn(x[nt][1]);
      }
    }
  }
}

// Additive bias of key j: 0, or -inf for a masked key or one past the end.
__device__ __forceinline__ float key_bias(const FlashArgs& a, const Block& r, int64_t j) {
  if (j >= r.Lk) return -INFINITY;
  if (!a.varlen && !key_kept(a.mask, r.b, j)) return -INFINITY;
  return 0.0f;
}

// Key tile j0 (K and V in `buffer` of kv) made ready for the whole block:
// this thread's copies landed and its K chunks rotated, the tile's key biases
// in sBias, then a barrier. The forward and the dq pass open each key tile so.
template <int kThreads>
__device__ __forceinline__ void key_tile_ready(const StreamedPair<kThreads>& kv, int buffer,
                                               const Block& r, int64_t j0, const FlashArgs& a,
                                               float* sBias) {
  kv.arrive(buffer, r, j0, r.Lk, a);
  if (threadIdx.x < kInnerTile) sBias[threadIdx.x] = key_bias(a, r, j0 + threadIdx.x);
  __syncthreads();  // every thread's copies, rotations and biases are visible
}

// --- forward --------------------------------------------------------------------------

// The keep bits of a warp's 16 x 64 tile (keys j0...): bit hf * 16 + 2 nt + e
// is row g + 8 hf, key j0 + 8 nt + 2 t + e. A Philox block holds the draws
// of one row's 8-key tile, and its word t is lane t's two keys. The quad's
// four lanes share rows g and g + 8, so each lane draws four of the quad's
// sixteen blocks (tiles 2 t and 2 t + 1 of both rows) and hands each word to
// its owner by a shuffle within the quad. One block is drawn at a time: its
// ten rounds need few registers, and the eight warps of a block hide their
// latency.
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
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      // Lane t ^ x owns word t ^ x of this block; this lane gets word t of
      // lane (t ^ x)'s block, which is tile 2 (t ^ x) + c of row hf.
      const uint32_t sent = w.word(uint32_t(t ^ x));
      const uint32_t got = x == 0 ? sent : __shfl_xor_sync(0xffffffffu, sent, x);
      const int nt = 2 * (t ^ x) + c;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t key = j0 + nt * 8 + 2 * t + e;
        const bool kept = key < r.Lk && dropout_draw_in_word(got, uint32_t(e)) >= a.drop.threshold;
        keep |= uint32_t(kept) << (hf * 16 + 2 * nt + e);
      }
    }
  }
  return keep;
}

// Dropout on a warp's 16 x 64 probabilities p (keys j0...): multiplies kept
// ones by 1 / (1 - p) and zeroes the others, and writes the tile's two keep
// words of each row (rows < Lq, words inside the row's ceil(Lk / 32)).
__device__ __forceinline__ void dropout_tile(float (&p)[8][4], const FlashArgs& a, const Block& r,
                                             int64_t row0, int64_t j0, int g, int t) {
  const uint32_t keep = keep_mask(a, r, row0, j0, g, t);
  uint32_t words[2][2] = {{0u, 0u}, {0u, 0u}};
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t bit = (keep >> (hf * 16 + 2 * nt + e)) & 1u;
        p[nt][2 * hf + e] = bit ? p[nt][2 * hf + e] * a.inv_keep : 0.0f;
        words[hf][nt >> 2] |= bit << ((nt & 3) * 8 + 2 * t + e);
      }
  const int64_t row_words = (r.Lk + 31) / 32;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t word = quad_or(words[hf][w]);
      const int64_t i = row0 + g + 8 * hf, index = j0 / 32 + w;
      if (t == 2 * hf + w && i < r.Lq && index < row_words)
        row_of<uint32_t>(a.bits, r, i)[index] = word;
    }
}

// One key tile of the online softmax for a warp's 16 query rows: s holds
// the tile's raw scores Q K^T (keys j0...), becomes the probabilities
// exp2(scaled score + bias - running max); the running max m, the sum l and
// the output rows o are rescaled to the new max.
__device__ __forceinline__ void online_softmax_tile(float (&s)[8][4], float (&o)[8][4],
                                                    float (&m)[2], float (&l)[2], const float* bias,
                                                    float scale_log2, int t) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = s[nt][e] * scale_log2 + bias[nt * 8 + 2 * t + (e & 1)];
      s[nt][e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
  float corr[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    mx[hf] = quad_max(mx[hf]);
    corr[hf] = mx[hf] == -INFINITY ? 1.0f : exp2f(m[hf] - mx[hf]);
    m[hf] = mx[hf];
    l[hf] *= corr[hf];
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e >> 1;
      const float p = m[hf] == -INFINITY ? 0.0f : exp2f(s[nt][e] - m[hf]);
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
  const Block r = block_of(a, tiles);
  const int64_t i0 = r.tile * kRowsPerBlock;
  if (i0 >= r.Lq) return;  // the whole block: a shorter segment
  const bool rope = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const StreamedPair<kThreads> kv{sK, sV, a.k, a.v, rope ? sAngles : nullptr};
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
    float s[kM][8][4];
    if constexpr (kM == 1)
      mma_rows(s, qa, k_tile, lane);
    else
      mma_rows_shared_a(s, sQ, warp * kM * 16, k_tile, lane);
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      online_softmax_tile(s[mt], o[mt], m[mt], l[mt], sBias, a.scale_log2, t);
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
        *row_of<float>(a.lse, r, i) = empty ? -INFINITY : (m[mt][hf] + log2f(l[mt][hf])) * kLn2;
    }
    store_rows(o[mt], a.out, a.out_dtype, r, tile_row0, r.Lq, inv, a, false, g, t);
  }
}

// --- backward -------------------------------------------------------------------------

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

// --- host side ------------------------------------------------------------------------

bool rows_aligned(const KernelTensor& t) {
  if (!t.defined() || t.dtype != DType::bf16 || t.strides[t.ndim - 1] != 1 ||
      reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return false;
  for (int32_t d = 0; d + 1 < t.ndim; ++d)
    if (t.strides[d] % 8 != 0) return false;
  return true;
}

Operand operand_of(const KernelTensor& t) {
  if (!t.defined()) return {};
  if (t.ndim == 4) return {t.data, t.strides[0], t.strides[1], t.strides[2]};
  return {t.data, 0, t.strides[1], t.strides[0]};  // token stream [T, H, ...]
}

// lse [B, H, Sq] or [T, H] (and the delta scratch laid out like it).
Operand lse_operand(const KernelTensor& lse) {
  if (lse.ndim == 3) return {lse.data, lse.strides[0], lse.strides[1], lse.strides[2]};
  return {lse.data, 0, lse.strides[1], lse.strides[0]};
}

FlashArgs make_args(const AttentionParams& params, const FlashRope& rope, const KernelTensor& q,
                    const KernelTensor& k, const KernelTensor& v, const KernelTensor& key_mask,
                    const KernelTensor& segments, const KernelTensor& out, const KernelTensor& lse,
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

// Each kernel's dynamic shared memory before the angles (the layouts at the
// top of the kernels).
constexpr size_t kForwardShared =
    size_t(kRowsPerBlock + 4 * kInnerTile) * kLd * sizeof(bf16_t) + kInnerTile * sizeof(float);
constexpr size_t kDqShared = size_t(2 * (kRowsPerBlock + 2 * kInnerTile) * kLd) * sizeof(bf16_t) +
                             kInnerTile * sizeof(float);
constexpr size_t kDkvShared = size_t(2 * (kRowsPerBlock + 2 * kInnerTile) * kLd) * sizeof(bf16_t) +
                              12 * kInnerTile * sizeof(float);
// Two blocks an SM (the forward, and the dq pass's default) must fit the
// H100's 228 KB of shared memory an SM, 1 KB of it reserved per block, with
// RoPE's angles too: a larger layout would silently halve the warps an SM.
constexpr size_t kSharedPerSm = 228 * 1024, kReservedPerBlock = 1024;
constexpr size_t kAngleBytes = kAngleFloats * sizeof(float);
static_assert(2 * (kForwardShared + kAngleBytes + kReservedPerBlock) <= kSharedPerSm,
              "two forward blocks no longer fit an SM");
static_assert(2 * (kDqShared + kAngleBytes + kReservedPerBlock) <= kSharedPerSm,
              "two dq blocks no longer fit an SM");

// Shared bytes of the streamed tiles' RoPE angles: none without a table.
size_t angle_bytes(const FlashArgs& a) {
  return a.table ? kAngleBytes : 0;
}

// Sequences (batch rows or segments), tiles per sequence of `rows` rows.
struct Grid {
  int64_t sequences, tiles;
};
Grid grid_of(const AttentionParams& params, const KernelTensor& q, const KernelTensor& k,
             const KernelTensor& segments, bool keys) {
  if (q.ndim == 4) {
    const int64_t len = keys ? k.sizes[2] : q.sizes[2];
    return {q.sizes[0], (len + kRowsPerBlock - 1) / kRowsPerBlock};
  }
  const int64_t longest = params.longest_segment > 0 ? params.longest_segment : q.sizes[0];
  return {segments.sizes[0], (longest + kRowsPerBlock - 1) / kRowsPerBlock};
}

dim3 launch_grid(const Grid& g, int64_t heads) {
  RF_CHECK(g.sequences * g.tiles < (int64_t(1) << 31) && heads <= kMaxGridY,
           "flash attention: grid too large");
  return dim3(unsigned(g.sequences * g.tiles), unsigned(heads));
}

// The forward's tiling, process-wide (flash_forward_rows_per_warp).
std::atomic<int> forward_rows_per_warp{16};
// The dq pass's blocks an SM, process-wide (flash_dq_blocks_per_sm).
std::atomic<int> dq_blocks_per_sm{2};

}  // namespace

int flash_forward_rows_per_warp() {
  return forward_rows_per_warp.load();
}

int flash_dq_blocks_per_sm() {
  return dq_blocks_per_sm.load();
}

void set_flash_dq_blocks_per_sm(int blocks) {
  RF_CHECK(blocks == 1 || blocks == 2,
           "flash attention: the dq pass runs 1 or 2 blocks an SM, got ", blocks);
  dq_blocks_per_sm.store(blocks);
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

// The tensor-core and copy instructions the flash kernels are made of:
// mma.sync m16n8k16 (bf16 in, f32 accumulate) and the ldmatrix loads of its
// fragments from shared tiles, products of a warp's 16-row tiles with a
// shared tile, cp.async, exp2 on the SFU and quad reductions. Under
// ROFORMER_SIMT_EMULATION each instruction is the emulator's (tests/simt).
// Fragment layouts are those of the PTX ISA for mma.m16n8k16 (.bf16): lane =
// 4 g + t holds rows g and g + 8, columns 2t and 2t + 1 of each 8-wide tile.
#pragma once

#include <cmath>

#include "core/cuda/kernels/flash_attention_args.cuh"

namespace roformer::kernels::cuda {

namespace {

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

// Makes this thread's shared-memory writes (stores, landed cp.async copies)
// visible to the async proxy that Hopper's wgmma reads shared memory
// through (wgmma.cuh); a barrier must follow before another thread's wgmma
// reads them. Nothing to order in the emulator, whose wgmma reads shared
// memory when issued.
__device__ __forceinline__ void fence_shared_for_wgmma() {
#if !defined(ROFORMER_SIMT_EMULATION)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

// acc[m][16 x 64] += a[m] (one 16-wide k step of kM row tiles) times 64
// columns of B, load_b(b, np) giving columns [16 np, 16 np + 16) as two
// 8-wide fragments (b[0], b[1] and b[2], b[3]): each B fragment read from
// shared memory serves all kM tiles.
template <int kM, class LoadB>
__device__ __forceinline__ void mma_k_step(float (&acc)[kM][8][4], const uint32_t (&a)[kM][4],
                                           LoadB load_b) {
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    uint32_t b[4];
    load_b(b, np);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      mma(acc[m][2 * np], a[m], b[0], b[1]);
      mma(acc[m][2 * np + 1], a[m], b[2], b[3]);
    }
  }
}

// acc[m][16 x 64] += A (16 x 64, from the accumulator c[m]) times the shared
// tile s [64][kLd] read as B[k][n] = s[k][n], for kM row tiles.
template <int kM>
__device__ __forceinline__ void mma_accumulator_tile(float (&acc)[kM][8][4],
                                                     const float (&c)[kM][8][4], const bf16_t* s,
                                                     int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) accumulator_as_a(a[m], c[m], kk);
    mma_k_step(acc, a,
               [&](uint32_t(&b)[4], int np) { load_b_trans(b, s, kk * 16, np * 16, lane); });
  }
}

// c[m][16 x 64] = A_m (16 x 64) times B[k][n] = s[n][k] for the 64 rows n of
// the shared tile s, for kM row tiles; a_of(a, ks) gives the tiles' A
// fragments of k step ks.
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
    mma_k_step(c, a, [&](uint32_t(&b)[4], int np) { load_b_pair(b, s, np * 16, ks * 16, lane); });
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

}  // namespace

}  // namespace roformer::kernels::cuda
